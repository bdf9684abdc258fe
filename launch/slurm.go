package launch

import (
	"fmt"
	"os"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
)

// Where a job's hosts come from besides a hostfile, and how its agents are
// started: gtrain run --hosts, --hostfile slurm and --launcher.
const (
	// HostfileSlurm is --hostfile slurm: the hosts of the Slurm allocation
	// gtrain runs in (a file of that name is ./slurm).
	HostfileSlurm = hostfiles.Slurm
	// LauncherAuto starts agents with srun inside a Slurm allocation whose
	// nodes the job runs on, else over SSH.
	LauncherAuto = "auto"
	LauncherSSH  = "ssh"  // every other host's agent over SSH
	LauncherSrun = "srun" // every host's agent as a step of the Slurm allocation
)

// ParseLauncher checks a --launcher value; "" is auto.
func ParseLauncher(s string) (string, error) {
	switch s {
	case "", LauncherAuto:
		return LauncherAuto, nil
	case LauncherSSH, LauncherSrun:
		return s, nil
	}
	return "", fmt.Errorf("want auto, ssh or srun, not %q", s)
}

func (r *Request) env() func(string) string {
	if r.Getenv != nil {
		return r.Getenv
	}
	return os.Getenv
}

// fromSlurm says whether the job runs on the Slurm allocation's nodes:
// --hostfile slurm, or neither a hostfile nor --hosts inside an
// allocation (as DeepSpeed's and mpirun's Slurm support do).
func (r *Request) fromSlurm() bool {
	return r.Hostfile == HostfileSlurm || (r.Hostfile == "" && r.Hosts == "" && hostfiles.InSlurm(r.env()))
}

// MultiHost says whether the job's hosts come from a hostfile, --hosts or
// a Slurm allocation rather than being this machine alone; the built-in
// engine then names its run directory and counts its ranks as for a
// hostfile.
func (r *Request) MultiHost() bool {
	return r.Hostfile != "" || r.Hosts != "" || r.fromSlurm()
}

// clusterNodes returns the nodes of --hosts or of the Slurm allocation
// (see hostfiles.SlurmHosts for the slots of each), with the hostfile
// filters applied; ok is false when the job uses neither. It also refuses
// a --launcher that is none of auto, ssh and srun. nproc above 1 is
// --nproc-per-node given: the ranks of each node.
func (r *Request) clusterNodes(nproc int) (nodes []hostfiles.Node, ok bool, err error) {
	// Checked here, where a dry run sees it too, not only when agents start.
	if _, err := ParseLauncher(r.Launcher); err != nil {
		return nil, true, usage.Errorf("run: --launcher: %w", err)
	}
	var hosts []hostfiles.Host
	switch {
	case r.Hosts != "" && r.Hostfile != "":
		return nil, true, usage.Errorf("run: --hosts and --hostfile both name the hosts: give one")
	case r.Hosts != "":
		hosts, err = hostfiles.ListHosts(r.Hosts, nproc, "--hosts")
	case r.fromSlurm():
		given := 0
		if nproc > 1 {
			given = nproc
		}
		hosts, err = hostfiles.SlurmHosts(r.env(), given)
	default:
		return nil, false, nil
	}
	if err != nil {
		return nil, true, &usage.Error{Err: err}
	}
	nodes, err = hostfiles.Select(hosts, r.Filter)
	if err != nil {
		return nil, true, &usage.Error{Err: err}
	}
	return nodes, true, nil
}

// transport is what starts the job's agents: inside an allocation whose
// nodes the job runs on, or with --launcher srun, srun for every host
// (this machine's agent too, so that it is a step of the job like the
// others); else local's child process for this machine and ssh for the
// rest.
func (r *Request) transport(local, ssh Transport) (Transport, error) {
	launcher, err := ParseLauncher(r.Launcher)
	if err != nil {
		return nil, usage.Errorf("run: --launcher: %w", err)
	}
	if launcher == LauncherSSH || (launcher == LauncherAuto && !r.fromSlurm()) {
		return &Mux{Local: local, Remote: ssh}, nil
	}
	s, err := NewSrun(r.env())
	if err != nil {
		return nil, &usage.Error{Err: err}
	}
	return s, nil
}

package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"

	"github.com/gtrain/gtrain/internal/usage"
)

// hosts check and hosts topology inside a Slurm allocation reach the
// nodes as gtrain run starts its agents there (Request.transport): with
// srun, one job step per script, where users often have no SSH between
// the nodes at all.

// useLauncher sets how hc reaches the hosts of the hostfile at path for
// hc.Launcher, as gtrain run chooses for its agents: srun with
// --launcher srun, or with auto on the Slurm allocation's nodes
// (--hostfile slurm); else SSH. A transport already set (tests) stays.
func (hc *HostCheck) useLauncher(path string, getenv func(string) string) error {
	launcher, err := ParseLauncher(hc.Launcher)
	if err != nil {
		return usage.Errorf("--launcher: %w", err)
	}
	if hc.Srun != nil || launcher == LauncherSSH || (launcher == LauncherAuto && path != HostfileSlurm) {
		return nil
	}
	s, err := NewSrun(getenv)
	if err != nil {
		return &usage.Error{Err: err}
	}
	hc.Srun = s
	return nil
}

// srunMarker is what the first step on a node prints: srun's own
// failures (a node not in the allocation, or down) print other things.
const srunMarker = "gtrain-srun-reached"

// probeSrun reaches the host through a job step and gathers its facts:
// REACH is the step starting on the node; there is no login nor host key
// to check.
func (hc *HostCheck) probeSrun(ctx context.Context, p *hostProbe) {
	sh := hc.Srun.shell(p.host.Name)
	p.Auth, p.HostKey = skipped("srun"), skipped("srun")
	res, err := hc.bounded(ctx, sh, "echo "+srunMarker)
	if err == nil && !strings.Contains(res.stdout, srunMarker) {
		err = fmt.Errorf("exit status %d: %s", res.code, lastLine(strings.TrimSpace(res.stderr+"\n"+res.stdout)))
	}
	if err != nil {
		p.Reach = failed(shortReason(err))
		p.fail(fmt.Errorf("check: srun on %s: %w; check that the node is in the allocation (SLURM_JOB_NODELIST) and up (sinfo), or use --launcher ssh", p.Host, err))
		p.Gtrain, p.System, p.GPU, p.Master = skipped(""), skipped(""), skipped(""), skipped("")
		return
	}
	p.Reach, p.sh = passed("srun"), sh
	p.srunLocal, _ = hc.Srun.route(ctx, p.host.Name)
	hc.facts(ctx, p)
}

// shell runs scripts on node as steps of the allocation: one task there
// alone, sharing the node with the allocation's other steps, unbound and
// without MPI, as the agents' steps (srunArgs). Interrupted, srun gets
// SIGINT, which with --quit-on-interrupt ends the step: SIGKILL would
// end srun alone and leave the step running.
func (s *Srun) shell(node string) shellFunc {
	return func(ctx context.Context, script string) (shellResult, error) {
		bin := s.Srun
		if bin == "" {
			bin = "srun"
		}
		args := []string{"--jobid=" + s.JobID, "--nodes=1", "--ntasks=1", "--nodelist=" + node,
			"--overlap", "--quit-on-interrupt", "--quiet", "--cpu-bind=none", "--mpi=none", "--job-name=gtrain-hosts-check"}
		args = append(append(args, s.Extra...), "/bin/sh", "-c", script)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
		cmd.WaitDelay = srunKillBackstop
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if ctx.Err() != nil {
			return shellResult{}, context.Cause(ctx)
		}
		res := shellResult{stdout: out.String(), stderr: errb.String()}
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.Exited() {
			res.code, err = exit.ExitCode(), nil
		}
		if err != nil {
			err = fmt.Errorf("%s: %w", bin, err)
		}
		return res, err
	}
}

// gtrainPath is the gtrain the hosts would run: srun starts the agents
// from this executable's path on every node; SSH from --remote-gtrain,
// else ("") the copy a run leaves in the host's cache.
func (hc *HostCheck) gtrainPath() string {
	if hc.Srun != nil {
		return hc.Srun.Exe
	}
	return hc.SSH.Config.RemoteGtrain
}

// localAddr is this machine's address toward the probed host, nil when
// unknown.
func (p *hostProbe) localAddr() net.Addr {
	if p.client != nil {
		return p.client.LocalAddr()
	}
	return p.srunLocal
}

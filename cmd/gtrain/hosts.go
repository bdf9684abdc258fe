package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/detect"
)

// HostsCheckOptions are the inputs of `gtrain hosts check`.
type HostsCheckOptions struct {
	IO       *IOStreams
	Hostfile string
	Filter   hostfiles.Filter
	SSH      launch.SSHConfig
	Launcher string // how the hosts are reached: auto, ssh or srun
	Output   string // text or json
}

// NewCmdHosts is `gtrain hosts`: check, topology and detect.
func NewCmdHosts(ios *IOStreams, checkF func(context.Context, *HostsCheckOptions) error) *cobra.Command {
	return newGroup("hosts", "Check the hosts of a hostfile and see their hardware", "",
		NewCmdHostsCheck(ios, checkF), NewCmdHostsTopology(ios, nil), NewCmdHostsDetect(ios))
}

// NewCmdHostsCheck wires the flags of `gtrain hosts check` into
// HostsCheckOptions; checkF (hostsCheckRun when nil) does the work.
func NewCmdHostsCheck(ios *IOStreams, checkF func(context.Context, *HostsCheckOptions) error) *cobra.Command {
	opts := &HostsCheckOptions{IO: ios}
	if checkF == nil {
		checkF = hostsCheckRun
	}
	cmd := &cobra.Command{
		Use:   "check --hostfile FILE [flags]",
		Short: "Check every host is ready: SSH, host key, gtrain, OS, CPUs, GPUs, master reachable",
		Long: `Check, in parallel and each step within --ssh-timeout, that every host of the
hostfile is ready for gtrain run: it accepts a TCP connection and an SSH login
with a known host key; gtrain is there (or, with the same OS and architecture
as this machine, will be copied on first run); and it reaches node 0 (the
master) on node 0's SSH port. Reports OS/architecture, CPUs and GPUs, and
below the table each host's hardware as detection sees it (gtrain hosts
detect there): CPUs and NUMA nodes, GPUs (model, memory, NVLink or PCIe),
NICs and their rates, and problems (a GPU in a bad state, MIG on, a missing
NVLink, hosts that differ). A host whose gtrain is not there yet has its
GPUs counted with nvidia-smi -L. Hosts that are this machine are checked
without SSH. Nothing is started or copied.

Inside a Slurm allocation, --hostfile slurm reaches the nodes as gtrain run
starts its agents there (--launcher auto): with srun, one job step for each
check, not SSH; REACH is then the step starting on the node, AUTH and HOST
KEY do not apply, and gtrain must be at this gtrain's path on every node.
--launcher srun does so for any hostfile's hosts of the allocation, and
--launcher ssh uses SSH even there.

Exits 0 when every host is ready, 1 when one is not. The SSH flags are those of
gtrain run, and like them may come from GTRAIN_* variables or the config file.`,
		Example: `  gtrain hosts check --hostfile hosts.txt
  gtrain hosts check --hostfile hosts.txt --exclude worker-3 --ssh-timeout 3s -o json
  gtrain hosts check --hostfile slurm   # in an sbatch script or salloc: over srun`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return checkF(cmd.Context(), opts)
		},
	}
	cmd.Flags().SetNormalizeFunc(underscoreToDash)
	f := cmd.Flags()
	addHostfileFlags(f, &opts.Hostfile, &opts.Filter, "check")
	addSSHFlags(f, &opts.SSH)
	addReachFlag(f, &opts.Launcher)
	addOutputFlag(f, &opts.Output, "one document with every host's checks")
	return cmd
}

// addHostfileFlags adds --hostfile and the filters that select from it,
// the same for every command that takes a hostfile; verb says what the
// command does with the hosts ("use", "check").
func addHostfileFlags(f *pflag.FlagSet, hostfile *string, filter *hostfiles.Filter, verb string) {
	f.StringVarP(hostfile, "hostfile", "H", "", "hostfile with \"host slots=N\" lines (DeepSpeed/Open MPI form)")
	f.StringVarP(&filter.Include, "include", "i", "", verb+" only these hosts/slots, e.g. worker-0:0,2@worker-1")
	f.StringVarP(&filter.Exclude, "exclude", "e", "", "leave out these hosts/slots, e.g. worker-1:0")
	f.IntVar(&filter.NumNodes, "num-nodes", 0, verb+" only the first N hosts of the hostfile")
	f.IntVar(&filter.NumSlots, "num-gpus", 0, "use only the first N slots of each host")
}

// addSSHFlags adds the SSH flags of gtrain run, with the same names and
// defaults.
func addSSHFlags(f *pflag.FlagSet, c *launch.SSHConfig) {
	f.StringVar(&c.User, "ssh-user", "", "SSH login user when the hostfile and ~/.ssh/config name none (default: you)")
	f.StringArrayVar(&c.Identities, "identity", nil, "SSH identity file, tried before ~/.ssh/config's and ~/.ssh/id_* (repeatable)")
	f.StringArrayVar(&c.KnownHosts, "ssh-known-hosts", nil, "known_hosts file (default ~/.ssh/known_hosts; repeatable)")
	f.BoolVar(&c.AcceptNew, "ssh-accept-new", false, "trust the key of a host not yet in known_hosts and remember it (never a changed key)")
	f.StringVar(&c.ConfigFile, "ssh-config", "", "ssh_config file (default ~/.ssh/config; \"none\" to ignore)")
	f.DurationVar(&c.ConnectTimeout, "ssh-timeout", 10*time.Second, "connect and handshake timeout per host (hosts check: each step)")
	f.StringVar(&c.RemoteGtrain, "remote-gtrain", "", "gtrain's path on the hosts (default: this binary, copied by gtrain run to ~/.cache/gtrain there)")
}

// addReachFlag adds --launcher to the commands that reach hosts without
// running a job, choosing as gtrain run's does.
func addReachFlag(f *pflag.FlagSet, launcher *string) {
	f.StringVar(launcher, "launcher", launch.LauncherAuto, "how the hosts are reached: auto (srun on a Slurm allocation's nodes, else ssh), ssh, srun")
}

// hostsCheckRun checks the hosts (launch.HostCheck.CheckHostfile) and
// prints the reports.
func hostsCheckRun(ctx context.Context, o *HostsCheckOptions) error {
	switch {
	case o.Hostfile == "":
		return usage.Errorf("hosts check: --hostfile is required")
	case o.SSH.ConnectTimeout <= 0:
		return usage.Errorf("hosts check: --ssh-timeout %v: must be positive", o.SSH.ConnectTimeout)
	}
	hc := &launch.HostCheck{SSH: &launch.SSH{Config: o.SSH, Warn: onceEach(o.IO.Err)}, Version: buildVersion(), Launcher: o.Launcher}
	reports, err := hc.CheckHostfile(ctx, o.Hostfile, o.Filter)
	if err != nil {
		return err
	}
	if o.Output == outputJSON {
		err = printHostsJSON(o.IO.Out, reports)
	} else {
		err = printHostsTable(o.IO, reports)
	}
	if err != nil {
		return err
	}
	if ready := launch.CountReady(reports); ready < len(reports) {
		// The table (or JSON) has said which and why; keep the exit code only.
		return &silentError{fmt.Errorf("hosts check: %d of %d hosts ready", ready, len(reports))}
	}
	return nil
}

// onceEach prints each distinct message once to w, as gtrain's warning
// line: hosts are checked in parallel and may warn alike (an unreadable
// identity).
func onceEach(w io.Writer) func(msg string) {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		if !seen[msg] {
			seen[msg] = true
			fmt.Fprintf(w, "gtrain: %s\n", msg)
		}
	}
}

// printHostsJSON writes {"hosts": [...]}.
func printHostsJSON(w io.Writer, reports []launch.HostReport) error {
	if reports == nil {
		reports = []launch.HostReport{}
	}
	return writeJSON(w, struct {
		Hosts []launch.HostReport `json:"hosts"`
	}{reports})
}

var hostsHeaders = []string{"HOST", "REACH", "AUTH", "HOST KEY", "GTRAIN", "OS/ARCH", "CPUS", "GPUS", "MASTER"}

// printHostsTable writes one row per host, each host's errors in full, and
// "N of M hosts ready". A status is always a word ("ok", "FAIL: refused");
// colour only repeats it, and not with NO_COLOR or when stdout is no terminal.
func printHostsTable(ios *IOStreams, reports []launch.HostReport) error {
	rows := make([][]string, len(reports))
	for i, r := range reports {
		rows[i] = hostRow(r)
	}
	cell, colour := tableCell(ios)
	good, bad := cell, cell
	if colour {
		good, bad = cell.Foreground(lipgloss.Color("2")), cell.Foreground(lipgloss.Color("1")).Bold(true)
	}
	var b strings.Builder
	b.WriteString(renderTable(cell, hostsHeaders, rows, func(row, col int) lipgloss.Style {
		switch {
		case strings.HasPrefix(rows[row][col], "FAIL"):
			return bad
		case rows[row][col] == "ok":
			return good
		}
		return cell
	}))
	for _, r := range reports {
		if r.Error != "" {
			fmt.Fprintf(&b, "%s: %s\n", r.Host, r.Error)
		}
	}
	for _, r := range reports {
		if r.Facts != nil {
			fmt.Fprintf(&b, "%s:\n", r.Host)
			detect.Describe(&b, *r.Facts, "  ")
		}
	}
	for _, d := range launch.UnequalHosts(reports) {
		fmt.Fprintf(&b, "problem: %s\n", d)
	}
	fmt.Fprintf(&b, "%d of %d hosts ready\n", launch.CountReady(reports), len(reports))
	_, err := io.WriteString(ios.Out, b.String())
	return err
}

// hostRow is the cells of one host.
func hostRow(r launch.HostReport) []string {
	host := r.Host
	if r.Addr != "" && r.Addr != net.JoinHostPort(strings.Trim(r.Host, "[]"), "22") {
		host += " (" + r.Addr + ")"
	}
	gtrain := checkCell(r.Gtrain)
	if r.Gtrain.State == launch.CheckOK && r.GtrainVersion != "" {
		gtrain = r.GtrainVersion
	}
	osArch, cpus := checkCell(r.System), "-"
	if r.System.State == launch.CheckOK {
		osArch, cpus = r.OSArch, strconv.Itoa(r.CPUs)
	}
	gpus := checkCell(r.GPU)
	if r.GPU.State == launch.CheckOK {
		gpus = strconv.Itoa(r.GPUs)
		if r.GPU.Detail != "" {
			gpus += " (" + r.GPU.Detail + ")"
		}
	}
	return []string{host, checkCell(r.Reach), checkCell(r.Auth), checkCell(r.HostKey), gtrain, osArch, cpus, gpus, checkCell(r.Master)}
}

// checkCell is a check as a table cell: "ok" (or its note), "FAIL: reason", or
// "-" when it did not run.
func checkCell(c launch.CheckResult) string {
	switch c.State {
	case launch.CheckFailed:
		return "FAIL: " + c.Detail
	case launch.CheckSkipped:
		if c.Detail != "" {
			return "- (" + c.Detail + ")"
		}
		return "-"
	}
	if c.Detail != "" {
		return c.Detail
	}
	return "ok"
}

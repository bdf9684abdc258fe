package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/detect"
	"github.com/gtrain/gtrain/planner"
)

// HostsTopologyOptions are the inputs of `gtrain hosts topology`.
type HostsTopologyOptions struct {
	IO       *IOStreams
	Hostfile string // none: this machine
	Filter   hostfiles.Filter
	SSH      launch.SSHConfig
	Launcher string // how the hosts are reached: auto, ssh or srun
	Output   string // text or json
	Matrix   bool
}

// NewCmdHostsTopology wires the flags of `gtrain hosts topology` into
// HostsTopologyOptions; runF (hostsTopologyRun when nil) does the work.
func NewCmdHostsTopology(ios *IOStreams, runF func(context.Context, *HostsTopologyOptions) error) *cobra.Command {
	opts := &HostsTopologyOptions{IO: ios}
	if runF == nil {
		runF = hostsTopologyRun
	}
	cmd := &cobra.Command{
		Use:   "topology [--hostfile FILE] [flags]",
		Short: "Write the detected cluster as a --topology file, or each host's GPU matrix",
		Long: `Detect the hardware of every host of the hostfile (gtrain hosts detect there,
reached as hosts check reaches them: over SSH, or with srun on a Slurm
allocation's nodes, --launcher; this machine alone without --hostfile) and
write the cluster as the planner sees it: with -o json, the file gtrain plan
--topology reads. Hosts that differ are planned as the weakest, with a
warning on stderr; hosts with unequal GPU counts, or a GPU the planner's
catalog lacks, are refused with the reason. Hosts without GPUs are the
built-in engine's CPU ranks, one per NUMA node.

--matrix prints instead each host's GPU matrix as nvidia-smi topo -m does
(NV#, PIX, PXB, PHB, NODE, SYS, with CPU and NUMA Affinity).`,
		Example: `  gtrain hosts topology -o json > cluster.json && gtrain plan --model llama2-7b --topology cluster.json
  gtrain hosts topology --hostfile hosts.txt --matrix`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runF(cmd.Context(), opts)
		},
	}
	cmd.Flags().SetNormalizeFunc(underscoreToDash)
	f := cmd.Flags()
	addHostfileFlags(f, &opts.Hostfile, &opts.Filter, "detect")
	addSSHFlags(f, &opts.SSH)
	addReachFlag(f, &opts.Launcher)
	addOutputFlag(f, &opts.Output, "the planner's topology, the file plan --topology reads")
	f.BoolVar(&opts.Matrix, "matrix", false, "print each host's GPU matrix as nvidia-smi topo -m does")
	return cmd
}

// hostsTopologyRun detects the hosts and prints their topology or matrices.
func hostsTopologyRun(ctx context.Context, o *HostsTopologyOptions) error {
	if o.Hostfile != "" && o.SSH.ConnectTimeout <= 0 {
		return usage.Errorf("hosts topology: --ssh-timeout %v: must be positive", o.SSH.ConnectTimeout)
	}
	hosts, err := detectedHosts(ctx, o)
	if err != nil {
		return err
	}
	if o.Matrix {
		return writeMatrices(o.IO.Out, hosts)
	}
	top, warns, err := planner.TopologyOf(hosts)
	if err != nil {
		return fmt.Errorf("hosts topology: %w", err)
	}
	for _, w := range warns {
		fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", w)
	}
	if o.Output == outputJSON {
		return writeJSON(o.IO.Out, top)
	}
	_, err = fmt.Fprintf(o.IO.Out, "nodes: %d\ngpus per node: %d\ngpu: %s (%.1f GiB, %.4g TFLOP/s bf16)\nintra: %s\ninter: %s\n",
		top.Nodes, top.GPUsPerNode, top.GPU.Name, float64(top.GPU.MemoryBytes)/(1<<30), top.GPU.PeakFLOPS/1e12, top.Intra.Describe(), top.Inter.Describe())
	return err
}

// detectedHosts is this machine's facts, or the hostfile's hosts'.
func detectedHosts(ctx context.Context, o *HostsTopologyOptions) ([]hostinfo.Host, error) {
	if o.Hostfile == "" {
		return []hostinfo.Host{detect.Local(ctx)}, nil
	}
	hc := &launch.HostCheck{SSH: &launch.SSH{Config: o.SSH, Warn: onceEach(o.IO.Err)}, Version: buildVersion(), Launcher: o.Launcher}
	reports, err := hc.CheckHostfile(ctx, o.Hostfile, o.Filter)
	if err != nil {
		return nil, err
	}
	hosts, err := launch.Detected(reports)
	if err != nil {
		return nil, fmt.Errorf("hosts topology: %w", err)
	}
	return hosts, nil
}

// writeMatrices writes each host's name and matrix.
func writeMatrices(w io.Writer, hosts []hostinfo.Host) error {
	for i, h := range hosts {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s:\n", h.Name)
		if err := detect.WriteMatrix(w, h); err != nil {
			return err
		}
	}
	return nil
}

// NewCmdHostsDetect is `gtrain hosts detect`: this machine's hardware as
// JSON (hostinfo.Host), what hosts check and hosts topology run on each
// host.
func NewCmdHostsDetect(ios *IOStreams) *cobra.Command {
	return &cobra.Command{
		Use:   "detect",
		Short: "Print this machine's hardware as JSON: GPUs, NUMA nodes, NICs, cgroup limits",
		Long: `Print this machine's hardware as detection sees it, one JSON document:
GPUs through NVML (index, name, UUID, memory, PCI bus id, compute capability,
MIG, CPU and NUMA affinity, NVLinks and the GPU matrix; without a driver none,
and gpu_error says why), CPUs and NUMA nodes, NICs (InfiniBand, RoCE,
Ethernet) with rates and NUMA nodes, and the cgroup's limits. hosts check
and hosts topology run it on every host.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeJSON(ios.Out, detect.Local(cmd.Context()))
		},
	}
}

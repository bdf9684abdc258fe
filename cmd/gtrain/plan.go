package main

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
	"github.com/gtrain/gtrain/planner"
)

// PlanOptions are the inputs of `gtrain plan`.
type PlanOptions struct {
	IO *IOStreams

	// The model: a preset, a parameter count, and/or shape overrides.
	Preset string
	Params string
	Shape  planner.Model // non-zero fields override the preset / --params shape

	GlobalBatch int
	Precision   string

	// The cluster: --gpus (+ --gpus-per-node, --gpu, --intra, --inter),
	// --topology, or --hostfile.
	GPUs, GPUsPerNode int
	GPU               string
	Intra, Inter      string
	Topology          string
	Hostfile          string

	Pins      planner.Space
	Recompute []string // --recompute, parsed into Pins.Recompute

	Efficiency       float64
	CommEfficiency   float64
	UsableMemory     float64
	SequenceParallel bool

	Top     int
	All     bool
	Explain bool
	Output  string

	changed func(string) bool
}

// NewCmdPlan wires the flags of `gtrain plan` into PlanOptions.
func NewCmdPlan(ios *IOStreams) *cobra.Command {
	o := &PlanOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Preview 3D-parallel layouts for a model on a cluster",
		Long: `Search tensor × pipeline × data parallel layouts, ZeRO stages, micro-batch
sizes and activation recomputation for a model on a cluster, and rank the
layouts that fit in memory by predicted step time. Memory per GPU, step
time, TFLOP/s, MFU and the pipeline bubble come from published formulas
(ZeRO, Korthikanti et al. 2022, Narayanan et al. 2021; docs/planner.md).

Pin any knob with --tp, --pp, --dp, --zero, --micro-batch or --recompute;
with all of them pinned, exactly that layout is evaluated. --explain breaks
the chosen layout down (memory, communication per link, the rank grid).
Exits 1 when no layout fits, after showing the closest misses and why.`,
		Example: `  gtrain plan --model megatron-1t --gpus 3072 --gpu A100-80GB
  gtrain plan --model llama3-70b --gpus 64 --gpu H100 --inter ib:8x400 --explain
  gtrain plan --params 13B --seq 4096 --global-batch 1024 --gpus 32 --tp 4 --zero 1
  gtrain plan --layers 48 --hidden 6144 --heads 48 --vocab 51200 --seq 2048 --topology cluster.json -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.changed = cmd.Flags().Changed
			return planRun(cmd.Context(), o)
		},
	}
	addPlanFlags(cmd.Flags(), o)
	return cmd
}

func addPlanFlags(f *pflag.FlagSet, o *PlanOptions) {
	f.StringVar(&o.Preset, "model", "", "model preset: "+strings.Join(presetNames(), ", "))
	f.StringVar(&o.Params, "params", "", "model by parameter count (GPT-3-style shape), e.g. 13B, 1.5e9, 1T")
	f.StringVar((*string)(&o.Shape.Arch), "arch", "", "gpt (GELU MLP, tied embedding) or llama (SwiGLU, GQA, untied); default gpt")
	f.IntVar(&o.Shape.Layers, "layers", 0, "transformer layers")
	f.IntVar(&o.Shape.Hidden, "hidden", 0, "hidden size")
	f.IntVar(&o.Shape.Heads, "heads", 0, "attention heads")
	f.IntVar(&o.Shape.KVHeads, "kv-heads", 0, "key/value heads (grouped-query attention; default: heads)")
	f.IntVar(&o.Shape.FFN, "ffn", 0, "MLP inner size (default 4×hidden; llama: 8/3×hidden rounded up to 256)")
	f.IntVar(&o.Shape.Vocab, "vocab", 0, "vocabulary size")
	f.IntVar(&o.Shape.Seq, "seq", 0, "training sequence length")
	f.IntVar(&o.GlobalBatch, "global-batch", 0, "sequences per optimizer step (default: the preset's published batch, else 512)")
	f.StringVar(&o.Precision, "precision", "bf16", "bf16, fp16 (both mixed with fp32 Adam) or fp32")
	f.IntVar(&o.GPUs, "gpus", 0, "GPUs in the cluster")
	f.IntVar(&o.GPUsPerNode, "gpus-per-node", 8, "GPUs per node (with --gpus)")
	f.StringVar(&o.GPU, "gpu", "A100-80GB", "GPU model: "+strings.Join(gpuNames(), ", "))
	f.StringVar(&o.Intra, "intra", "", "link between GPUs of a node, kind:[Nx]Gb/s or kind:GB/s-with-GB, e.g. nvswitch:300GB, pcie4:256 (default: the GPU's usual)")
	f.StringVar(&o.Inter, "inter", "", "each node's network, kind:NxGb/s, e.g. ib:4x200, eth:100, roce:8x400 (default: the GPU's usual)")
	f.StringVar(&o.Topology, "topology", "", "JSON file describing the cluster (a planner.Topology) instead of --gpus")
	f.StringVarP(&o.Hostfile, "hostfile", "H", "", "hostfile whose slots are GPUs, instead of --gpus")
	f.IntSliceVar(&o.Pins.TP, "tp", nil, "pin the tensor-parallel degree")
	f.IntSliceVar(&o.Pins.PP, "pp", nil, "pin the pipeline-parallel degree")
	f.IntSliceVar(&o.Pins.DP, "dp", nil, "pin the data-parallel degree")
	f.IntSliceVar(&o.Pins.Zero, "zero", nil, "pin the ZeRO stage (0-3)")
	f.IntSliceVar(&o.Pins.MicroBatch, "micro-batch", nil, "pin the micro-batch size (sequences)")
	f.StringSliceVar(&o.Recompute, "recompute", nil, "pin recomputation: none, selective or full")
	f.Float64Var(&o.Efficiency, "efficiency", planner.DefaultOptions().Efficiency, "fraction of peak FLOP/s large matrix multiplies reach (calibrate: docs/planner.md)")
	f.Float64Var(&o.CommEfficiency, "comm-efficiency", planner.DefaultOptions().CommEfficiency, "fraction of a link's rate collectives reach")
	f.Float64Var(&o.UsableMemory, "usable-memory", planner.DefaultOptions().UsableMemory, "fraction of GPU memory tensors may use (the rest: CUDA context, fragmentation)")
	f.BoolVar(&o.SequenceParallel, "sequence-parallel", true, "shard TP-replicated activations over the TP group (Megatron-LM --sequence-parallel)")
	f.IntVar(&o.Top, "top", 10, "show the K fastest layouts")
	f.BoolVar(&o.All, "all", false, "list every evaluated layout, the rejected ones with their reason")
	f.BoolVar(&o.Explain, "explain", false, "explain the chosen layout: memory breakdown, communication per link, rank grid")
	addOutputFlag(f, &o.Output, "one document with every layout")
}

// planRun resolves the inputs, searches, and prints.
func planRun(ctx context.Context, o *PlanOptions) error {
	pr, err := o.problem(ctx)
	if err != nil {
		return err
	}
	res, err := search(ctx, pr, o.Pins)
	if err != nil {
		return err
	}
	if o.Output == "json" {
		err = printPlanJSON(o, pr, res)
	} else {
		err = printPlanText(o, pr, res)
	}
	if err != nil {
		return err
	}
	if res.Feasible == 0 {
		return noFitError(pr, res)
	}
	return nil
}

// search is planner.Search, returning context.Cause(ctx) as soon as ctx is
// done: the search itself takes no context, and a large one takes seconds.
// Its goroutine then runs on until the process exits.
func search(ctx context.Context, pr planner.Problem, pins planner.Space) (planner.Result, error) {
	type result struct {
		res planner.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := planner.Search(pr, pins)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return r.res, usageErr("plan: %v", r.err)
		}
		return r.res, nil
	case <-ctx.Done():
		return planner.Result{}, context.Cause(ctx)
	}
}

func usageErr(format string, a ...any) error {
	return usage.Errorf(format, a...)
}

// problem checks the flags and builds the planner's input.
func (o *PlanOptions) problem(ctx context.Context) (planner.Problem, error) {
	if err := o.check(); err != nil {
		return planner.Problem{}, err
	}
	m, batch, err := o.model()
	if err != nil {
		return planner.Problem{}, err
	}
	top, err := o.topology(ctx)
	if err != nil {
		return planner.Problem{}, err
	}
	prec, err := planner.ParsePrecision(o.Precision)
	if err != nil {
		return planner.Problem{}, usageErr("plan: --precision: %v", err)
	}
	if o.GlobalBatch > 0 {
		batch = o.GlobalBatch
	}
	pr := planner.Problem{Model: m, Topology: top, GlobalBatch: batch, Precision: prec, Options: planner.Options{
		Efficiency: o.Efficiency, CommEfficiency: o.CommEfficiency, UsableMemory: o.UsableMemory, SequenceParallel: o.SequenceParallel}}
	if err := pr.Validate(); err != nil {
		return pr, usageErr("plan: %v", err)
	}
	return pr, nil
}

// check validates flag values that need no other input.
func (o *PlanOptions) check() error {
	if err := o.readRecompute(); err != nil {
		return err
	}
	if err := o.dedupPins(); err != nil {
		return err
	}
	for name, vals := range map[string][]int{"tp": o.Pins.TP, "pp": o.Pins.PP, "dp": o.Pins.DP, "micro-batch": o.Pins.MicroBatch} {
		for _, v := range vals {
			if v < 1 {
				return usageErr("plan: --%s %d: must be at least 1", name, v)
			}
		}
	}
	for _, z := range o.Pins.Zero {
		if z < 0 || z > 3 {
			return usageErr("plan: --zero %d: want a ZeRO stage 0 to 3", z)
		}
	}
	switch {
	case o.Top < 1:
		return usageErr("plan: --top %d: must be at least 1 (--all lists everything)", o.Top)
	case !(o.Efficiency > 0 && o.Efficiency <= 1):
		return usageErr("plan: --efficiency %g: want a fraction of peak in (0, 1], e.g. 0.7", o.Efficiency)
	case !(o.CommEfficiency > 0 && o.CommEfficiency <= 1):
		return usageErr("plan: --comm-efficiency %g: want a fraction in (0, 1], e.g. 0.8", o.CommEfficiency)
	case !(o.UsableMemory > 0 && o.UsableMemory <= 1):
		return usageErr("plan: --usable-memory %g: want a fraction in (0, 1], e.g. 0.9", o.UsableMemory)
	case o.GlobalBatch < 0:
		return usageErr("plan: --global-batch %d: must be at least 1", o.GlobalBatch)
	}
	return nil
}

// maxPinValues bounds the values of one pinned knob: the search evaluates
// every combination of the pinned values, so long lists multiply its time.
const maxPinValues = 64

// dedupPins drops repeated values of the pinned knobs (each would be
// evaluated, and listed, once more) and refuses long lists.
func (o *PlanOptions) dedupPins() error {
	for _, p := range []struct {
		name string
		vals *[]int
	}{{"tp", &o.Pins.TP}, {"pp", &o.Pins.PP}, {"dp", &o.Pins.DP}, {"zero", &o.Pins.Zero}, {"micro-batch", &o.Pins.MicroBatch}} {
		if *p.vals == nil {
			continue
		}
		slices.Sort(*p.vals)
		*p.vals = slices.Compact(*p.vals)
		if len(*p.vals) > maxPinValues {
			return usageErr("plan: --%s: %d values: pin at most %d (leave it out to search them all)", p.name, len(*p.vals), maxPinValues)
		}
	}
	if o.Pins.Recompute != nil {
		slices.Sort(o.Pins.Recompute)
		o.Pins.Recompute = slices.Compact(o.Pins.Recompute)
	}
	return nil
}

// readRecompute parses the pinned recomputation modes.
func (o *PlanOptions) readRecompute() error {
	o.Pins.Recompute = nil
	for _, s := range o.Recompute {
		rc, err := planner.ParseRecompute(s)
		if err != nil {
			return usageErr("plan: --recompute: %v", err)
		}
		o.Pins.Recompute = append(o.Pins.Recompute, rc)
	}
	return nil
}

// model resolves the model flags and the default global batch.
func (o *PlanOptions) model() (planner.Model, int, error) {
	var m planner.Model
	batch := 512
	switch {
	case o.Preset != "" && o.Params != "":
		return m, 0, usageErr("plan: --model and --params both name the model: give one (shape flags like --seq adjust either)")
	case o.Preset != "":
		p, err := planner.LookupPreset(o.Preset)
		if err != nil {
			return m, 0, usageErr("plan: --model: %v", err)
		}
		m, batch = p.Model, p.GlobalBatch
	case o.Params != "":
		n, err := parseCount(o.Params)
		if err == nil {
			m, err = planner.FromParams(n)
		}
		if err != nil {
			return m, 0, usageErr("plan: --params %q: %v", o.Params, err)
		}
	case o.Shape.Layers == 0 || o.Shape.Hidden == 0 || o.Shape.Heads == 0:
		return m, 0, usageErr("plan: no model: give --model NAME, --params N, or the shape (--layers, --hidden, --heads, and --vocab, --seq)")
	default:
		m = planner.Model{Name: "custom", Vocab: 51200, Seq: 2048}
	}
	m = overlayShape(m, o.Shape)
	if err := m.Validate(); err != nil {
		return m, 0, usageErr("plan: %v", err)
	}
	return m, batch, nil
}

// overlayShape applies the non-zero shape flags to m.
func overlayShape(m, s planner.Model) planner.Model {
	if s.Arch != "" && s.Arch != m.Arch {
		m.Arch, m.FFN = s.Arch, 0 // the FFN default depends on the architecture
	}
	for _, f := range []struct{ dst, v *int }{
		{&m.Layers, &s.Layers}, {&m.Hidden, &s.Hidden}, {&m.Heads, &s.Heads}, {&m.KVHeads, &s.KVHeads},
		{&m.FFN, &s.FFN}, {&m.Vocab, &s.Vocab}, {&m.Seq, &s.Seq},
	} {
		if *f.v != 0 {
			*f.dst = *f.v
		}
	}
	if s.Heads != 0 && s.KVHeads == 0 && m.KVHeads > m.Heads {
		m.KVHeads = 0
	}
	if s.Hidden != 0 && s.FFN == 0 {
		m.FFN = 0 // recomputed from the new hidden size
	}
	return m.Normalized()
}

// parseCount reads a count like 175B, 1.5e9, 7b, 350M or 1T.
func parseCount(s string) (float64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mult = 1e3
		case 'm', 'M':
			mult = 1e6
		case 'b', 'B', 'g', 'G':
			mult = 1e9
		case 't', 'T':
			mult = 1e12
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, errors.New("want a positive count like 13B, 1.5e9 or 1T")
	}
	return v * mult, nil
}

// topology resolves the cluster flags: exactly one of --gpus, --topology
// and --hostfile.
func (o *PlanOptions) topology(ctx context.Context) (planner.Topology, error) {
	sources := 0
	for _, set := range []bool{o.GPUs != 0, o.Topology != "", o.Hostfile != ""} {
		if set {
			sources++
		}
	}
	switch {
	case sources == 0:
		return planner.Topology{}, usageErr("plan: no cluster: give --gpus N (with --gpus-per-node, --gpu), --topology FILE or --hostfile FILE")
	case sources > 1:
		return planner.Topology{}, usageErr("plan: --gpus, --topology and --hostfile each describe the cluster: give one")
	case o.Topology != "":
		return o.topologyFile(ctx)
	}
	nodes, gpn := 0, o.GPUsPerNode
	if o.Hostfile != "" {
		var err error
		if nodes, gpn, err = hostfileShape(ctx, o.Hostfile); err != nil {
			return planner.Topology{}, err
		}
	} else {
		if o.GPUs < 1 || gpn < 1 {
			return planner.Topology{}, usageErr("plan: --gpus %d, --gpus-per-node %d: each must be at least 1", o.GPUs, gpn)
		}
		gpn = min(gpn, o.GPUs)
		if o.GPUs%gpn != 0 {
			return planner.Topology{}, usageErr("plan: --gpus %d is not a multiple of --gpus-per-node %d: the planner needs whole, equal nodes", o.GPUs, gpn)
		}
		nodes = o.GPUs / gpn
	}
	return o.catalogTopology(nodes, gpn)
}

// catalogTopology is nodes × gpn of --gpu, with --intra and --inter.
func (o *PlanOptions) catalogTopology(nodes, gpn int) (planner.Topology, error) {
	e, err := planner.LookupGPU(o.GPU)
	if err != nil {
		return planner.Topology{}, usageErr("plan: --gpu: %v", err)
	}
	top := planner.Topology{Nodes: nodes, GPUsPerNode: gpn, GPU: e.GPU, Intra: e.Intra, Inter: e.Inter}
	for _, l := range []struct {
		flag, val string
		dst       *planner.Link
	}{{"intra", o.Intra, &top.Intra}, {"inter", o.Inter, &top.Inter}} {
		if l.val == "" {
			continue
		}
		if *l.dst, err = planner.ParseLink(l.val); err != nil {
			return top, usageErr("plan: --%s: %v", l.flag, err)
		}
	}
	if nodes == 1 && o.Inter == "" {
		top.Inter = planner.Link{Kind: "none"}
	}
	return top, nil
}

// topologyFile reads --topology; the per-GPU and link flags then conflict.
func (o *PlanOptions) topologyFile(ctx context.Context) (planner.Topology, error) {
	for _, f := range []string{"gpu", "gpus-per-node", "intra", "inter"} {
		if o.changed != nil && o.changed(f) {
			return planner.Topology{}, usageErr("plan: --%s and --topology both describe the cluster: edit the file or drop --topology", f)
		}
	}
	data, err := userfile.Read(ctx, o.Topology, userfile.ConfigLimit)
	if err != nil {
		return planner.Topology{}, userfile.Prefix(ctx, "plan: --topology", err)
	}
	top, err := planner.ParseTopology(data)
	if err != nil {
		return top, usageErr("plan: --topology %s: %v", o.Topology, err)
	}
	return top, nil
}

// hostfileShape is the nodes and GPUs per node of a hostfile whose slots
// are GPUs. The planner's nodes are identical, so unequal slot counts are
// refused rather than guessed at.
func hostfileShape(ctx context.Context, path string) (nodes, gpn int, err error) {
	hosts, err := hostfiles.ReadFile(ctx, path)
	if err != nil {
		return 0, 0, err
	}
	for _, h := range hosts {
		if h.Slots != hosts[0].Slots {
			return 0, 0, usageErr("plan: --hostfile %s: %s has %d slots and %s %d: the planner needs the same GPUs on every node; plan with --gpus N --gpus-per-node G instead",
				path, hosts[0].Name, hosts[0].Slots, h.Name, h.Slots)
		}
	}
	return len(hosts), hosts[0].Slots, nil
}

func presetNames() []string { return slices.Sorted(maps.Keys(planner.Presets)) }

func gpuNames() []string { return slices.Sorted(maps.Keys(planner.Catalog)) }

package planner

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/internal/usage"
)

// Request is a plan as a person asks for it on the command line (the flags
// of `gtrain plan`): names, counts and files that ProblemFrom resolves into
// a Problem and the pinned Space. Its errors are usage errors that name the
// flag at fault, "plan: --tp 0: must be at least 1".
type Request struct {
	// The model: a preset, a parameter count, and/or shape overrides.
	Preset string // a name of Presets
	Params string // a parameter count like 13B, 1.5e9 or 1T
	Shape  Model  // non-zero fields override the preset / Params shape

	GlobalBatch int    // sequences per step; 0: the preset's published batch, else 512
	Precision   string // bf16, fp16 or fp32

	// The cluster: GPUs (with GPUsPerNode, GPU, Intra, Inter), Topology or
	// Hostfile, exactly one.
	GPUs, GPUsPerNode int
	GPU               string // a Catalog name
	Intra, Inter      string // links as ParseLink reads them; "" the GPU's usual
	Topology          string // a JSON file holding a Topology
	Hostfile          string // a hostfile whose slots are GPUs
	// Detected is the cluster as its hosts reported it (plan --detect:
	// TopologyOf their facts), instead of the three above.
	Detected *Topology

	Pins      Space    // pinned knobs; Pins.Recompute is set from Recompute
	Recompute []string // pinned recomputation modes, as ParseRecompute reads them
	Options   Options

	// Changed reports whether the flag of that name (without "--") was
	// given, so that a flag left at its default does not conflict with
	// Topology. Nil means no flag was.
	Changed func(flag string) bool
}

// Plan is `gtrain plan`'s search: it resolves r, searches the layouts it
// pins, and returns the problem with the result. It returns
// context.Cause(ctx) as soon as ctx is done.
func Plan(ctx context.Context, r Request) (Problem, Result, error) {
	pr, sp, err := ProblemFrom(ctx, r)
	if err != nil {
		return pr, Result{}, err
	}
	res, err := searchContext(ctx, pr, sp)
	return pr, res, err
}

// searchContext is Search, returning context.Cause(ctx) as soon as ctx is
// done: the search itself takes no context, and a large one takes seconds.
// Its goroutine then runs on until it finishes, which a command that was
// interrupted does not wait for.
func searchContext(ctx context.Context, pr Problem, sp Space) (Result, error) {
	type result struct {
		res Result
		err error
	}
	if ctx.Err() != nil {
		return Result{}, context.Cause(ctx)
	}
	done := make(chan result, 1) // buffered: an abandoned search does not block
	go func() {
		res, err := Search(pr, sp)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return r.res, usage.Errorf("plan: %v", r.err)
		}
		return r.res, nil
	case <-ctx.Done():
		return Result{}, context.Cause(ctx)
	}
}

// ProblemFrom checks r and builds the planner's input: the Problem and the
// Space of pinned knobs (repeated values dropped). It reads r.Topology or
// r.Hostfile, whichever is given.
func ProblemFrom(ctx context.Context, r Request) (Problem, Space, error) {
	sp, err := r.pins()
	if err != nil {
		return Problem{}, sp, err
	}
	if err := r.checkOptions(); err != nil {
		return Problem{}, sp, err
	}
	m, batch, err := r.model()
	if err != nil {
		return Problem{}, sp, err
	}
	top, err := r.topology(ctx)
	if err != nil {
		return Problem{}, sp, err
	}
	prec, err := ParsePrecision(r.Precision)
	if err != nil {
		return Problem{}, sp, usage.Errorf("plan: --precision: %v", err)
	}
	if r.GlobalBatch > 0 {
		batch = r.GlobalBatch
	}
	pr := Problem{Model: m, Topology: top, GlobalBatch: batch, Precision: prec, Options: r.Options}
	if err := pr.Validate(); err != nil {
		return pr, sp, usage.Errorf("plan: %v", err)
	}
	return pr, sp, nil
}

// checkOptions validates the cost model's options and the global batch,
// naming their flags.
func (r Request) checkOptions() error {
	o := r.Options
	switch {
	case !(o.Efficiency > 0 && o.Efficiency <= 1):
		return usage.Errorf("plan: --efficiency %g: want a fraction of peak in (0, 1], e.g. 0.7", o.Efficiency)
	case !(o.CommEfficiency > 0 && o.CommEfficiency <= 1):
		return usage.Errorf("plan: --comm-efficiency %g: want a fraction in (0, 1], e.g. 0.8", o.CommEfficiency)
	case !(o.UsableMemory > 0 && o.UsableMemory <= 1):
		return usage.Errorf("plan: --usable-memory %g: want a fraction in (0, 1], e.g. 0.9", o.UsableMemory)
	case r.GlobalBatch < 0:
		return usage.Errorf("plan: --global-batch %d: must be at least 1", r.GlobalBatch)
	}
	return nil
}

// maxPinValues bounds the values of one pinned knob: the search evaluates
// every combination of the pinned values, so long lists multiply its time.
const maxPinValues = 64

// pins is r.Pins with r.Recompute parsed into it, repeated values dropped
// (each would be evaluated, and listed, once more) and every value checked.
func (r Request) pins() (Space, error) {
	sp := Space{TP: slices.Clone(r.Pins.TP), PP: slices.Clone(r.Pins.PP), DP: slices.Clone(r.Pins.DP),
		Zero: slices.Clone(r.Pins.Zero), MicroBatch: slices.Clone(r.Pins.MicroBatch), VirtualStages: slices.Clone(r.Pins.VirtualStages)}
	for _, s := range r.Recompute {
		rc, err := ParseRecompute(s)
		if err != nil {
			return sp, usage.Errorf("plan: --recompute: %v", err)
		}
		sp.Recompute = append(sp.Recompute, rc)
	}
	if err := dedupPins(&sp); err != nil {
		return sp, err
	}
	for name, vals := range map[string][]int{"tp": sp.TP, "pp": sp.PP, "dp": sp.DP, "micro-batch": sp.MicroBatch, "virtual-stages": sp.VirtualStages} {
		for _, v := range vals {
			if v < 1 {
				return sp, usage.Errorf("plan: --%s %d: must be at least 1", name, v)
			}
		}
	}
	for _, v := range sp.VirtualStages {
		if v > MaxVirtualStages {
			return sp, usage.Errorf("plan: --virtual-stages %d: at most %d model chunks per pipeline rank (1 is the 1F1B schedule)", v, MaxVirtualStages)
		}
	}
	for _, z := range sp.Zero {
		if z < 0 || z > 3 {
			return sp, usage.Errorf("plan: --zero %d: want a ZeRO stage 0 to 3", z)
		}
	}
	return sp, nil
}

// dedupPins sorts and compacts the pinned values of sp and refuses long
// lists.
func dedupPins(sp *Space) error {
	for _, p := range []struct {
		name string
		vals *[]int
	}{{"tp", &sp.TP}, {"pp", &sp.PP}, {"dp", &sp.DP}, {"zero", &sp.Zero}, {"micro-batch", &sp.MicroBatch}, {"virtual-stages", &sp.VirtualStages}} {
		if *p.vals == nil {
			continue
		}
		slices.Sort(*p.vals)
		*p.vals = slices.Compact(*p.vals)
		if len(*p.vals) > maxPinValues {
			return usage.Errorf("plan: --%s: %d values: pin at most %d (leave it out to search them all)", p.name, len(*p.vals), maxPinValues)
		}
	}
	if sp.Recompute != nil {
		slices.Sort(sp.Recompute)
		sp.Recompute = slices.Compact(sp.Recompute)
	}
	return nil
}

// model resolves the model of r and the default global batch.
func (r Request) model() (Model, int, error) {
	var m Model
	batch := 512
	switch {
	case r.Preset != "" && r.Params != "":
		return m, 0, usage.Errorf("plan: --model and --params both name the model: give one (shape flags like --seq adjust either)")
	case r.Preset != "":
		p, err := LookupPreset(r.Preset)
		if err != nil {
			return m, 0, usage.Errorf("plan: --model: %v", err)
		}
		m, batch = p.Model, p.GlobalBatch
	case r.Params != "":
		n, err := parseCount(r.Params)
		if err == nil {
			m, err = FromParams(n)
		}
		if err != nil {
			return m, 0, usage.Errorf("plan: --params %q: %v", r.Params, err)
		}
	case r.Shape.Layers == 0 || r.Shape.Hidden == 0 || r.Shape.Heads == 0:
		return m, 0, usage.Errorf("plan: no model: give --model NAME, --params N, or the shape (--layers, --hidden, --heads, and --vocab, --seq)")
	default:
		m = Model{Name: "custom", Vocab: 51200, Seq: 2048}
	}
	m = overlayShape(m, r.Shape)
	if err := m.Validate(); err != nil {
		return m, 0, usage.Errorf("plan: %v", err)
	}
	return m, batch, nil
}

// overlayShape applies the non-zero shape flags to m.
func overlayShape(m, s Model) Model {
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

// PresetNames is the names of Presets, sorted.
func PresetNames() []string { return sortedKeys(Presets) }

// GPUNames is the names of the Catalog, sorted.
func GPUNames() []string { return sortedKeys(Catalog) }

// Command gridpredict prints the planner's prediction for layouts of a
// built-in-engine job on this host, as `gtrain run --auto` would predict
// them (engine/train.PredictLayout on the CPU description run --auto plans
// with, measured once for all of them): one JSON line per layout with the
// step time, tokens/s, the memory of the most loaded rank and the parts of
// the step. docs/bench/grid.sh sets them beside the measured figures.
//
//	go run ./docs/bench/gridpredict -micro-batch 2 4,2,2,4 2,1,1,2
//
// Each layout is RANKS,TP,PP,GRAD_ACCUM (all ranks on this host).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/planner"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gridpredict:", err)
		os.Exit(1)
	}
}

// prediction is what gridpredict prints for one layout.
type prediction struct {
	Layout     string             `json:"layout"` // as given
	StepMs     float64            `json:"step_ms"`
	TokensPerS float64            `json:"tokens_per_s"`
	Memory     planner.Memory     `json:"memory"` // bytes, the most loaded rank
	Bubble     float64            `json:"bubble_fraction"`
	Parts      map[string]float64 `json:"parts"` // the step time's, ms
	Speed      planner.CPUSpeed   `json:"cpu"`
}

func run(args []string) error {
	fs := flag.NewFlagSet("gridpredict", flag.ContinueOnError)
	preset := fs.String("preset", "small", "model preset")
	zero := fs.Int("zero", 0, "parallel.zero_stage")
	mb := fs.Int("micro-batch", 1, "batch.micro_batch")
	defaults := fs.Bool("defaults", false, "plan with planner.DefaultCPUSpeed instead of measuring this host (train.MeasureCPU, as run --auto does)")
	mem := fs.Int64("mem", 16<<30, "host memory in bytes (decides only what fits)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	speed := planner.DefaultCPUSpeed
	if !*defaults {
		speed = train.MeasureCPU()
	}
	enc := json.NewEncoder(os.Stdout)
	for _, l := range fs.Args() {
		var n, tp, pp, ga int
		if _, err := fmt.Sscanf(l, "%d,%d,%d,%d", &n, &tp, &pp, &ga); err != nil || n < 1 || n > 4096 {
			return fmt.Errorf("layout %q: want RANKS,TP,PP,GRAD_ACCUM with 1 to 4096 ranks", l)
		}
		spec := train.DefaultSpec()
		spec.Model = train.ModelSpec{Preset: *preset}
		spec.Batch = train.BatchSpec{MicroBatch: *mb, GradAccum: ga}
		spec.Parallel.TP, spec.Parallel.PP, spec.Parallel.ZeroStage = tp, pp, *zero
		p, err := predict(spec, speed.Topology([]int{n}, *mem, runtime.NumCPU()))
		if err != nil {
			return fmt.Errorf("layout %q: %w", l, err)
		}
		p.Layout, p.Speed = l, speed
		if err := enc.Encode(p); err != nil {
			return err
		}
	}
	return nil
}

// predict is the planner's prediction for spec's layout on top.
func predict(spec train.Spec, top planner.Topology) (prediction, error) {
	c, err := train.PredictLayout(spec, top)
	if err != nil {
		return prediction{}, err
	}
	m, err := spec.ModelConfig()
	if err != nil {
		return prediction{}, err
	}
	d := c.Detail
	tokens := float64(spec.Batch.MicroBatch * spec.Batch.GradAccum * c.DP * spec.SeqLen(m))
	return prediction{StepMs: c.StepTime * 1e3, TokensPerS: tokens / c.StepTime, Memory: c.Memory, Bubble: c.Bubble,
		Parts: map[string]float64{"compute_ms": d.Compute * 1e3, "memory_bound_ms": d.MemoryBound * 1e3,
			"bubble_ms": d.BubbleTime * 1e3, "tp_ms": d.TPTime * 1e3, "pp_exposed_ms": d.PPExposed * 1e3,
			"dp_exposed_ms": d.DPExposed * 1e3, "optimizer_ms": d.Optimizer * 1e3}}, nil
}

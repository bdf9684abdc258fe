package ckpt

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
)

// testShapes are the tensors of the test checkpoints: parameters with
// GPT-2's names, the optimizer's moments, and a scalar.
var testShapes = []struct {
	name  string
	shape []int
}{
	{"transformer.wte.weight", []int{11, 6}},
	{"transformer.h.0.ln_1.bias", []int{6}},
	{"transformer.h.0.attn.c_attn.weight", []int{6, 18}},
	{"optimizer.exp_avg.transformer.wte.weight", []int{11, 6}},
	{"optimizer.exp_avg_sq.transformer.wte.weight", []int{11, 6}},
	{"optimizer.step", []int{}},
}

// value is element i of tensor k at step: an integer below 2^24, so exact
// in float32 and different for every step, tensor and element.
func value(step int64, k, i int) float32 {
	h := uint64(step)*0x9e3779b97f4a7c15 ^ uint64(k)*0xbf58476d1ce4e5b9 ^ uint64(i)*0x94d049bb133111eb
	h ^= h >> 31
	h *= 0xd6e8feb86d049b13
	h ^= h >> 29
	return float32(h >> 40)
}

// fullTensors are the whole tensors of step's checkpoint, scaled by size
// elements in their first dimension (1 for the small ones).
func fullTensors(step int64, scale int) []Tensor {
	out := make([]Tensor, len(testShapes))
	for k, s := range testShapes {
		shape := slices.Clone(s.shape)
		if len(shape) > 0 {
			shape[0] *= scale
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = value(step, k, i)
		}
		out[k] = Tensor{Name: s.name, Shape: shape, Data: data}
	}
	return out
}

// shardOf is rank's slice of every tensor when world ranks split them
// unevenly: rank r holds [cut(r), cut(r+1)) with cut growing quadratically,
// so the first ranks hold little (sometimes nothing) and the last the most.
func shardOf(full []Tensor, rank, world int) []Tensor {
	cut := func(r, n int) int { return n * r * r / (world * world) }
	out := make([]Tensor, len(full))
	for k, t := range full {
		lo, hi := cut(rank, len(t.Data)), cut(rank+1, len(t.Data))
		out[k] = Tensor{Name: t.Name, Shape: t.Shape, Offset: lo, Data: t.Data[lo:hi]}
	}
	return out
}

// stateOf is rank's state at step.
func stateOf(step int64, rank int) []byte {
	return []byte(fmt.Sprintf(`{"step":%d,"rank":%d,"rng":[%d,7],"sampler":{"epoch":1,"pos":%d}}`, step, rank, step*31+int64(rank), step*512))
}

// testJob is the job spec the test checkpoints carry.
var testJob = json.RawMessage(`{"model":"gpt2-test","save_every":1}`)

// writeCheckpoint writes step's checkpoint from world ranks, concurrently,
// and commits it keeping keep.
func writeCheckpoint(root string, step int64, world, scale, keep int, warn func(string)) error {
	full := fullTensors(step, scale)
	files := make([]File, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			files[r], errs[r] = WriteShard(root, step, r, shardOf(full, r, world), stateOf(step, r))
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	m := Manifest{Step: step, Job: testJob, Layout: Layout{World: world, DP: world, TP: 1, PP: 1, ZeroStage: 1}, Files: files}
	return Commit(root, m, keep, warn)
}

// checkContent fails unless c holds exactly step's tensors and states.
func checkContent(c *Checkpoint, scale int) error {
	step := c.Step()
	for _, want := range fullTensors(step, scale) {
		got, shape, err := c.Tensor(want.Name)
		if err != nil {
			return err
		}
		if !slices.Equal(shape, want.Shape) || !slices.Equal(got, want.Data) {
			return fmt.Errorf("step %d: tensor %s: shape %v (want %v) or data differ", step, want.Name, shape, want.Shape)
		}
	}
	for _, f := range c.Manifest.Files {
		_, state, err := c.Shard(f.Rank)
		if err != nil {
			return err
		}
		if want := stateOf(step, f.Rank); string(state) != string(want) {
			return fmt.Errorf("step %d rank %d: state %q, want %q", step, f.Rank, state, want)
		}
	}
	return nil
}

// warnings collects warn messages.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

// warn records msg; it is safe for concurrent use.
func (w *warnings) warn(msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

// String is the messages, one per line.
func (w *warnings) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.msgs, "\n")
}

// mustWrite writes a checkpoint or fails the test.
func mustWrite(t testing.TB, root string, step int64, world, keep int) {
	t.Helper()
	if err := writeCheckpoint(root, step, world, 1, keep, nil); err != nil {
		t.Fatalf("write step %d: %v", step, err)
	}
}

// bitsEqual compares float32 slices bit for bit (NaN included).
func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

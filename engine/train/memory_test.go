package train

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestSpecBounds: every count of a spec has an upper bound, and every
// number must be finite; the error names the key.
func TestSpecBounds(t *testing.T) {
	for _, tt := range []struct {
		key string
		mut func(*Spec)
	}{
		{"model: layers 100000", func(s *Spec) { s.Model.Layers = 100_000 }},
		{"model: heads 2048", func(s *Spec) { s.Model.Heads, s.Model.Embd = 2048, 2048 }},
		{"model: embd 131072", func(s *Spec) { s.Model.Embd = 1 << 17 }},
		{"model: seq 2097152", func(s *Spec) { s.Model.Seq = 1 << 21 }},
		{"steps", func(s *Spec) { s.Steps = MaxSteps + 1 }},
		{"batch.micro_batch", func(s *Spec) { s.Batch.MicroBatch = MaxMicroBatch + 1 }},
		{"batch.grad_accum", func(s *Spec) { s.Batch.GradAccum = MaxGradAccum + 1 }},
		{"data.synthetic", func(s *Spec) { s.Data.Synthetic = 99_999_999_999_999 }},
		{"eval.batches", func(s *Spec) { s.Eval.Batches = MaxEvalBatch + 1 }},
		{"threads", func(s *Spec) { s.Threads = MaxThreads + 1 }},
		{"parallel.dp", func(s *Spec) { s.Parallel.DP = MaxDP + 1 }},
		{"parallel.bucket_mb", func(s *Spec) { s.Parallel.BucketMB = 1e300 }},
		{"parallel.bucket_mb", func(s *Spec) { s.Parallel.BucketMB = math.Inf(1) }},
		{"optim.min_lr", func(s *Spec) { s.Optim.MinLR = math.NaN() }},
		{"optim.grad_clip", func(s *Spec) { s.Optim.GradClip = math.NaN() }},
		{"optim.weight_decay", func(s *Spec) { s.Optim.WeightDecay = math.NaN() }},
		{"optim.beta1", func(s *Spec) { s.Optim.Beta1 = math.NaN() }},
		{"loss_scale.min_scale", func(s *Spec) { s.LossScale.MinScale = math.NaN() }},
	} {
		t.Run(tt.key, func(t *testing.T) {
			s := DefaultSpec()
			tt.mut(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.key) {
				t.Fatalf("Validate: %v, want an error naming %q", err, tt.key)
			}
		})
	}
	s := DefaultSpec() // the bounds themselves are allowed
	s.Model.Layers, s.Steps, s.Batch.GradAccum, s.Threads = 1024, MaxSteps, MaxGradAccum, MaxThreads
	if err := s.Validate(); err != nil {
		t.Errorf("a spec at the bounds: %v", err)
	}
}

// estimateShapes are jobs of a few tens to a few hundred MB: large enough
// that the allocations estimated dwarf the small ones not estimated
// (parameter descriptions, maps, the sampler).
var estimateShapes = []struct {
	prec, recompute string
	stage           int
	layers, embd    int
	seq, micro      int
}{
	{"fp32", "none", 0, 4, 256, 256, 4},
	{"bf16", "selective", 3, 4, 256, 256, 4},
	{"fp16", "full", 2, 8, 128, 512, 2},
	{"bf16", "none", 1, 2, 512, 128, 8},
}

func estimateSpec(i int) Spec {
	c := estimateShapes[i]
	s := smallSpec("")
	s.Checkpoint, s.Eval = CkptSpec{}, EvalSpec{}
	s.Model = ModelSpec{Preset: "small"}
	s.Model.Layers, s.Model.Embd, s.Model.Heads, s.Model.Seq = c.layers, c.embd, 4, c.seq
	s.Batch = BatchSpec{MicroBatch: c.micro, Seq: c.seq, GradAccum: 2}
	s.Precision, s.Recompute, s.Parallel.ZeroStage = c.prec, c.recompute, c.stage
	s.Data.Synthetic = 200_000
	s.Steps = 1
	return s
}

// buildBand is how far the estimate of what New allocates may be from
// what it does allocate (runtime.MemStats.TotalAlloc over New): the
// estimate counts the parameters, gradients, optimizer state, activations,
// the initialisation's fp32 copy and the synthetic corpus, each exactly;
// what it leaves out (parameter names and shapes, the sampler, maps) is
// measured at 0.3% of the total for these shapes.
const buildBand = 0.05

// TestMemoryEstimateMatchesBuild: the estimate of each shape is within
// buildBand of what New allocates; after a step, the engine's buffers
// are at most their estimate and at least half of it (the estimate is an
// upper bound of the pool's high-water mark: measured 1.3-1.6 times it).
func TestMemoryEstimateMatchesBuild(t *testing.T) {
	for i, c := range estimateShapes {
		t.Run(fmt.Sprintf("%s/%s/stage%d", c.prec, c.recompute, c.stage), func(t *testing.T) {
			s := estimateSpec(i)
			rs, err := s.Resolved()
			if err != nil {
				t.Fatal(err)
			}
			est, err := EstimateMemory(rs, 1, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			tr, err := New(s, Env{World: 1})
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			got, want := float64(after.TotalAlloc-before.TotalAlloc), est.Total()-est.Buffers
			t.Logf("New allocated %s, estimate %s (ratio %.4f)", humanBytes(got), humanBytes(want), want/got)
			if math.Abs(want/got-1) > buildBand {
				t.Errorf("estimate %s (%+v), New allocated %s: more than %g apart", humanBytes(want), est, humanBytes(got), buildBand)
			}
			m := tr.Memory()
			if float64(m.Activations) != est.Activations || float64(m.Params) != est.Params || float64(m.Grads) != est.Grads || float64(m.Optimizer) != est.Optimizer {
				t.Errorf("reported %+v, estimated %+v: activations and model states must be exact", m, est)
			}
			if _, err := tr.trainStep(); err != nil {
				t.Fatal(err)
			}
			if b := float64(tr.Memory().Buffers); b > est.Buffers || b < est.Buffers/2 {
				t.Errorf("buffers after a step %s, estimate %s: want between half the estimate and the estimate", humanBytes(b), humanBytes(est.Buffers))
			}
		})
	}
}

// TestMemoryRefusedBeforeAllocating: a job far beyond any machine (seq
// 100000: the attention probabilities alone are terabytes) is refused by
// New with a *MemoryError naming the estimate and the host's memory,
// having allocated next to nothing, and by CheckMemory, the launcher's
// check.
func TestMemoryRefusedBeforeAllocating(t *testing.T) {
	if capacity, _, _ := hostMemory(); !capacity.known() {
		t.Skip("this host's memory is unknown")
	}
	s := DefaultSpec()
	s.Model.Seq = 100_000
	s.Data.Synthetic = 200_002
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := New(s, Env{World: 1})
	runtime.ReadMemStats(&after)
	var me *MemoryError
	if !errors.As(err, &me) {
		t.Fatalf("New: %v, want a *MemoryError", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("New allocated %s before refusing", humanBytes(float64(alloc)))
	}
	msg := err.Error()
	for _, want := range []string{"TiB of memory per rank", "activations", "this host has", "MemTotal", "batch.micro_batch"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if err := CheckMemory(s, 2); !errors.As(err, &me) || me.Ranks != 2 || !strings.Contains(err.Error(), "× 2 ranks on this host") {
		t.Errorf("CheckMemory of 2 ranks: %v, want a *MemoryError for 2 ranks", err)
	}
	if err := CheckMemory(DefaultSpec(), 2); err != nil {
		t.Errorf("CheckMemory of the default job: %v", err)
	}
}

// TestMemoryUnbuildableMicroBatch: the estimate's activations are the
// model's own count (model.ActivationUseOf), so a micro-batch with a
// buffer beyond any host, which the model cannot build, is refused by
// Validate naming the keys; and when a resume on fewer ranks makes one
// (fitDP), by New before it generates the data or initialises anything.
func TestMemoryUnbuildableMicroBatch(t *testing.T) {
	s := DefaultSpec()
	s.Model.Seq = 1 << 20 // 4 heads × 2^40 attention probabilities for one sequence
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "job: model: micro-batch 16×1048576") || !strings.Contains(err.Error(), "batch.seq") {
		t.Errorf("Validate: %v, want the micro-batch refused, naming batch.micro_batch and batch.seq", err)
	}
	s = DefaultSpec()
	// 2^16 × 512 sequences per micro-step, all on one rank after resuming:
	// 2^41 floats of attention probabilities.
	s.Batch.MicroBatch, s.Parallel.DP = MaxMicroBatch, 512
	s.Data.Synthetic = 100_000_000 // 200 MB, generated only if the refusal comes late
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate over 512 ranks: %v", err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := New(s, Env{World: 1, Resume: true})
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "micro-batch 33554432×128") {
		t.Fatalf("New: %v, want the resharded micro-batch refused", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("New allocated %s before refusing", humanBytes(float64(alloc)))
	}
}

// TestHostMemoryFiles: the parsers of /proc/meminfo and of cgroup v1 and
// v2 memory files, on files written here.
func TestHostMemoryFiles(t *testing.T) {
	meminfo := []byte("MemTotal:       32617864 kB\nMemFree:         1000 kB\nMemAvailable:   24174944 kB\n")
	if v, ok := keyedValue(meminfo, "MemAvailable", 1024); !ok || v != 24174944*1024 {
		t.Errorf("MemAvailable: %v %v", v, ok)
	}
	for _, in := range []string{"", "MemTotal: lots kB\n", "MemTotal: -1 kB\n", "MemTotal: NaN kB\n", "MemTotal: Inf kB\n"} {
		if v, ok := keyedValue([]byte(in), "MemTotal", 1024); ok {
			t.Errorf("%q: MemTotal %v accepted", in, v)
		}
	}
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v2 := cgroupFiles{dir, "memory.max", "memory.current", "inactive_file"}
	write("memory.max", "8589934592\n")
	write("memory.current", "3221225472\n")
	write("memory.stat", "anon 100\ninactive_file 1073741824\nactive_file 5\n")
	if l, r, ok := v2.level(dir); !ok || l != 8<<30 || r != 6<<30 {
		t.Errorf("cgroup v2: limit %v, room %v, %v; want 8 GiB and 6 GiB (8 - (3 used - 1 inactive cache))", l, r, ok)
	}
	sub := filepath.Join(dir, "job")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "memory.max"), []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := v2.level(sub); ok {
		t.Error(`cgroup v2 "max" read as a limit`)
	}
	if l, _, ok := v2.walk("/job"); !ok || l != 8<<30 {
		t.Errorf("walk from a cgroup without a limit: %v %v, want its parent's 8 GiB", l, ok)
	}
	v1 := cgroupFiles{dir, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"}
	write("memory.limit_in_bytes", "9223372036854771712\n")
	write("memory.usage_in_bytes", "100\n")
	if _, _, ok := v1.level(dir); ok {
		t.Error("cgroup v1 unlimited read as a limit")
	}
	write("memory.limit_in_bytes", "1000\n")
	if l, r, ok := v1.level(dir); !ok || l != 1000 || r != 900 {
		t.Errorf("cgroup v1: limit %v, room %v, %v; want 1000 and 900", l, r, ok)
	}
}

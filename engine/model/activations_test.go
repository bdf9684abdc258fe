package model

import (
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/planner"
)

var modes = []Recompute{RecomputeNone, RecomputeSelective, RecomputeFull}

// engineStorage is how the engine keeps activations, in the planner's terms.
var engineStorage = planner.ActStorage{ElemBytes: 4, NoDropout: true}

// plannerShape is cfg trained on micro-batches of T tokens, as the planner
// (and gtrain run --auto) describes it.
func plannerShape(cfg Config, T int) planner.Model {
	return planner.Model{Arch: planner.ArchGPT, Layers: cfg.Layers, Hidden: cfg.Embd, Heads: cfg.Heads, KVHeads: cfg.Heads,
		FFN: 4 * cfg.Embd, Vocab: cfg.Vocab, Seq: T}
}

// otherBytes is what the planner leaves out, as ActivationUse.Other lists
// it: 2 floats per token for each LayerNorm whose statistics are kept (2 per
// block, one block's under full recomputation, and the final one), the
// losses (N), the projection output (N·C), backward's activation gradients
// (dres, dln, datty: N·C each; dqkv 3·N·C; dfch and dgelu 4·N·C each) and
// the attention scratch.
func otherBytes(cfg Config, B, T int, rc Recompute, attScratch int) int64 {
	N, C, blocks := int64(B*T), int64(cfg.Embd), int64(cfg.Layers)
	if rc == RecomputeFull {
		blocks = 1
	}
	return 4 * (2*(2*blocks+1)*N + N + N*C + 14*N*C + int64(attScratch))
}

// TestActivationsMatchPlanner: for each recomputation mode the engine keeps
// exactly what the planner charges for the same shape (4-byte elements, no
// dropout): the blocks' kept activations, the head and recomputation's
// working set, byte for byte; and beyond them only the documented rest.
func TestActivationsMatchPlanner(t *testing.T) {
	shapes := []struct {
		name string
		cfg  Config
		B, T int
	}{
		{"test preset", Presets["test"], 2, 64},
		{"one layer, one head", Config{Layers: 1, Heads: 1, Embd: 8, Seq: 16, Vocab: 11}, 1, 16},
		{"odd sizes, short sequences", Config{Layers: 3, Heads: 3, Embd: 48, Seq: 40, Vocab: 101}, 3, 37},
		{"tiny preset, micro-batch 5", Presets["tiny"], 5, 128},
		{"many heads, long sequence", Config{Layers: 2, Heads: 16, Embd: 64, Seq: 512, Vocab: 257}, 1, 512},
	}
	for _, s := range shapes {
		for _, rc := range modes {
			t.Run(s.name+"/"+string(rc), func(t *testing.T) {
				be := backend.CPU{Threads: 2}
				m, err := New(s.cfg, s.B, s.T, be, rc)
				if err != nil {
					t.Fatal(err)
				}
				want := planner.ModelActivations(plannerShape(s.cfg, s.T), s.B, planner.FP32, engineStorage, planner.Recompute(rc))
				got := m.ActivationUse()
				if got.Layers != int64(want.Layer)*int64(s.cfg.Layers) || got.Head != int64(want.Head) || got.Working != int64(want.WorkingSet) {
					t.Errorf("engine keeps %+v; planner: %d layers × %.0f, head %.0f, working set %.0f",
						got, s.cfg.Layers, want.Layer, want.Head, want.WorkingSet)
				}
				if o := otherBytes(s.cfg, s.B, s.T, rc, be.AttentionScratch(s.T)); got.Other != o {
					t.Errorf("other %d bytes, want %d", got.Other, o)
				}
				if m.ActivationBytes() != got.Total() {
					t.Errorf("ActivationBytes %d, ActivationUse total %d", m.ActivationBytes(), got.Total())
				}
				if dry, err := ActivationUseOf(s.cfg, s.B, s.T, rc, be.AttentionScratch(s.T)); err != nil || dry != got {
					t.Errorf("ActivationUseOf %+v, %v; New allocated %+v", dry, err, got)
				}
			})
		}
	}
}

// held walks the model's activation structs and finds the distinct float32
// arrays they reference: it reads what is there, not what the accounting
// says.
type held struct {
	seen  map[unsafe.Pointer]bool // every array
	probs map[unsafe.Pointer]bool // those in fields named att (the probabilities)
}

// bytes is the size of the arrays under v not seen before; name is the
// field v sits in.
func (h *held) bytes(v reflect.Value, name string) int64 {
	var n int64
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			n += h.bytes(v.Field(i), v.Type().Field(i).Name)
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.Float32 {
			for i := range v.Len() {
				n += h.bytes(v.Index(i), name)
			}
			break
		}
		p := v.UnsafePointer()
		if v.Cap() == 0 || h.seen[p] {
			break
		}
		h.seen[p] = true
		if name == "att" {
			h.probs[p] = true
		}
		n = int64(v.Cap()) * 4
	}
	return n
}

// TestActivationBuffersMeasured measures what each mode allocates, without
// the accounting: the distinct arrays the model holds, and the bytes the Go
// heap handed out while New built it. Both must be ActivationBytes (plus
// the dense store's parameters and gradients), selective and full must hold
// one probability buffer instead of one per block, and the measured
// differences between the modes must be the planner's.
func TestActivationBuffersMeasured(t *testing.T) {
	cfg := Config{Layers: 4, Heads: 4, Embd: 64, Seq: 256, Vocab: 257}
	const B, T = 4, 256
	wantAtt := map[Recompute]int{RecomputeNone: cfg.Layers, RecomputeSelective: 1, RecomputeFull: 1}
	allocated := map[Recompute]int64{}
	for _, rc := range modes {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m, err := New(cfg, B, T, backend.CPU{Threads: 1}, rc)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		h := held{seen: map[unsafe.Pointer]bool{}, probs: map[unsafe.Pointer]bool{}}
		if n := h.bytes(reflect.ValueOf(m.acts), "") + h.bytes(reflect.ValueOf(m.grad), ""); n != m.ActivationBytes() {
			t.Errorf("%s: the model holds %d bytes of activation buffers, ActivationBytes says %d", rc, n, m.ActivationBytes())
		}
		if len(h.probs) != wantAtt[rc] {
			t.Errorf("%s: %d probability buffers, want %d", rc, len(h.probs), wantAtt[rc])
		}
		// TotalAlloc only grows, so collections during New cannot hide an
		// allocation; size classes and page rounding add at most a few kB
		// per buffer (under 100 buffers here).
		allocated[rc] = int64(after.TotalAlloc-before.TotalAlloc) - 2*4*int64(cfg.NumParams())
		if d := allocated[rc] - m.ActivationBytes(); d < 0 || d > 1<<20 {
			t.Errorf("%s: New allocated %d bytes beyond parameters and gradients, ActivationBytes says %d", rc, allocated[rc], m.ActivationBytes())
		}
		runtime.KeepAlive(m)
	}
	pm := plannerShape(cfg, T)
	pred := func(rc Recompute) int64 {
		return int64(planner.ModelActivations(pm, B, planner.FP32, engineStorage, planner.Recompute(rc)).Total(cfg.Layers))
	}
	for _, pair := range [][2]Recompute{{RecomputeNone, RecomputeSelective}, {RecomputeSelective, RecomputeFull}} {
		got, want := allocated[pair[0]]-allocated[pair[1]], pred(pair[0])-pred(pair[1])
		if d := got - want; d < -1<<20 || d > 1<<20 {
			t.Errorf("%s saves %d bytes over %s, the planner predicts %d", pair[1], got, pair[0], want)
		}
	}
}

// TestActivationUseOfRefuses: a shape New cannot build is an error naming
// it, before any size is computed from it (no overflow, no allocation).
func TestActivationUseOfRefuses(t *testing.T) {
	cfg := Presets["gpt2"]
	for _, c := range []struct {
		name string
		B, T int
		rc   Recompute
		want string
	}{
		{"no sequences", 0, 64, RecomputeNone, "micro-batch 0×64"},
		{"longer than the model", 1, cfg.Seq + 1, RecomputeNone, "1 ≤ T ≤ seq (1024)"},
		{"a buffer past any host", 1 << 40, 1024, RecomputeFull, "use a smaller batch.micro_batch"},
		{"largest int", int(^uint(0) >> 1), 1024, RecomputeNone, "use a smaller batch.micro_batch"},
		{"unknown mode", 1, 64, "some", `recompute "some"`},
	} {
		if _, err := ActivationUseOf(cfg, c.B, c.T, c.rc, 0); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if _, err := NewWithStore(cfg, c.B, c.T, backend.CPU{}, c.rc, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

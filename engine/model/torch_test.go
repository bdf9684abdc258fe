package model

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/internal/proctest"
)

// TestMatchesPyTorch loads the engine's weights into the GPT-2 of
// testdata/gpt2_reference.py and compares the loss and every gradient.
// The reference runs in float64, so the differences are the engine's own
// float32 error: loss within 1e-6 relative, and each gradient tensor within
// 1e-5 of its largest magnitude. Measured: ~3e-8 and ~3e-7 (float32's
// epsilon is 1.2e-7), so the bounds leave a 30x margin and a wrong term,
// off by 1e-2 or more, cannot hide.
func TestMatchesPyTorch(t *testing.T) {
	py := proctest.NeedTorch(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		B, T int
	}{
		{"test preset", Presets["test"], 2, 32},
		{"odd sizes", Config{Layers: 3, Heads: 3, Embd: 48, Seq: 40, Vocab: 101}, 3, 37},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestModel(t, tc.cfg, tc.B, tc.T, RecomputeNone, 2)
			x, y := testBatch(tc.B, tc.T, tc.cfg.Vocab, 11)
			loss, err := m.Forward(x, y)
			if err != nil {
				t.Fatal(err)
			}
			m.Backward(1)
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "out.safetensors")
			writeReferenceInput(t, in, m, x, y)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if b, err := exec.CommandContext(ctx, py, "testdata/gpt2_reference.py", in, out).CombinedOutput(); err != nil {
				t.Fatalf("reference: %v\n%s", err, b)
			}
			compareReference(t, out, m, loss)
		})
	}
}

// writeReferenceInput writes m's parameters and the batch (as float32,
// exact below 2²⁴) as a safetensors file.
func writeReferenceInput(t *testing.T, path string, m *Model, x, y []int32) {
	header := map[string]any{"__metadata__": map[string]string{
		"layers": strconv.Itoa(m.Config.Layers), "heads": strconv.Itoa(m.Config.Heads)}}
	var data bytes.Buffer
	add := func(name string, shape []int, v []float32) {
		begin := data.Len()
		binary.Write(&data, binary.LittleEndian, v)
		header[name] = map[string]any{"dtype": "F32", "shape": shape, "data_offsets": []int{begin, data.Len()}}
	}
	for _, p := range m.ParamList() {
		add(p.Name, p.Shape, m.Params[p.Offset:p.Offset+p.Size()])
	}
	for name, toks := range map[string][]int32{"x": x, "y": y} {
		f := make([]float32, len(toks))
		for i, v := range toks {
			f[i] = float32(v)
		}
		add(name, []int{m.B, m.T}, f)
	}
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	h = append(h, bytes.Repeat([]byte(" "), (8-len(h)%8)%8)...)
	var file bytes.Buffer
	binary.Write(&file, binary.LittleEndian, uint64(len(h)))
	file.Write(h)
	file.Write(data.Bytes())
	if err := os.WriteFile(path, file.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func compareReference(t *testing.T, path string, m *Model, loss float32) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	h, err := ckpt.ReadHeader(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	want, err := strconv.ParseFloat(h.Metadata["loss"], 64)
	if err != nil {
		t.Fatalf("reference loss %q: %v", h.Metadata["loss"], err)
	}
	if d := math.Abs(float64(loss) - want); d > 1e-6*want {
		t.Errorf("loss %.8f, PyTorch %.8f (|Δ| %.2g)", loss, want, d)
	}
	for _, p := range m.ParamList() {
		e, ok := h.Entry(p.Name)
		if !ok {
			t.Errorf("reference has no gradient for %s", p.Name)
			continue
		}
		ref := make([]float32, e.Numel())
		if err := binary.Read(io.NewSectionReader(f, h.DataStart+e.Begin, e.End-e.Begin), binary.LittleEndian, ref); err != nil {
			t.Fatal(err)
		}
		got := m.Grads[p.Offset : p.Offset+p.Size()]
		var scale, worst float64
		for i := range ref {
			scale = math.Max(scale, math.Abs(float64(ref[i])))
			worst = math.Max(worst, math.Abs(float64(got[i])-float64(ref[i])))
		}
		if worst > 1e-5*scale+1e-12 {
			t.Errorf("%s: gradient differs from PyTorch by up to %.3g (largest magnitude %.3g)", p.Name, worst, scale)
		}
	}
}

package ckpt

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/proctest"
)

// pythonReader reads safetensors files the way the safetensors package
// does (Debian has no python3-safetensors): header length, JSON header,
// torch.frombuffer on the data. It checks each file's framing, that the BF16
// and F16 files are exactly PyTorch's own rounding of the F32 one, and
// prints the F32 tensors as {name: {"shape": [...], "bits": [...]}}.
const pythonReader = `
import json, struct, sys, torch
DT = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header length %d not a multiple of 8" % n
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    assert meta.get("format") == "pt", meta
    data = bytearray(raw[8 + n:])
    out, end = {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e_ = e["data_offsets"]
        assert b == end, (name, b, end)
        end = e_
        dt = DT[e["dtype"]]
        count = (e_ - b) // torch.empty(0, dtype=dt).element_size()
        t = torch.frombuffer(data, dtype=dt, count=count, offset=b) if count else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    assert end == len(data), (end, len(data))
    return out
f32, bf16, f16 = (load(p) for p in sys.argv[1:4])
assert f32.keys() == bf16.keys() == f16.keys()
for name, t in f32.items():
    assert torch.equal(bf16[name].view(torch.int16), t.to(torch.bfloat16).view(torch.int16)), name + ": bf16 differs from torch's rounding"
    assert torch.equal(f16[name].view(torch.int16), t.to(torch.float16).view(torch.int16)), name + ": f16 differs from torch's rounding"
print(json.dumps({n: {"shape": list(t.shape), "bits": t.reshape(-1).view(torch.int32).tolist()} for n, t in f32.items()}))
`

// TestExportReadByPyTorch: PyTorch reads the exports, full tensors from two
// ranks' shards, and rounds to BF16 and F16 exactly as Export did.
func TestExportReadByPyTorch(t *testing.T) {
	python := proctest.NeedTorch(t)
	root := t.TempDir()
	special := specialValues()
	full := append(fullTensors(7, 3), Tensor{Name: "special", Shape: []int{len(special)}, Data: special})
	var files []File
	for r := range 2 {
		f, err := WriteShard(root, 7, r, shardOf(full, r, 2), nil)
		must(t, err)
		files = append(files, f)
	}
	must(t, Commit(root, Manifest{Step: 7, Layout: Layout{2, 2, 1, 1, 2}, Files: files}, 0, nil))
	c, err := Latest(t.Context(), root, nil)
	must(t, err)
	out := t.TempDir()
	var paths []string
	for _, dtype := range []comm.DType{comm.Float32, comm.BFloat16, comm.Float16} {
		p := filepath.Join(out, dtype.String()+".safetensors")
		must(t, Export(t.Context(), c, p, ExportOptions{DType: dtype, Optimizer: true}))
		paths = append(paths, p)
	}
	cmd := exec.Command(python, append([]string{"-c", pythonReader}, paths...)...)
	cmd.Stderr = os.Stderr
	js, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	var got map[string]struct {
		Shape []int
		Bits  []int32
	}
	must(t, json.Unmarshal(js, &got))
	if len(got) != len(full) {
		t.Errorf("python read %d tensors, want %d", len(got), len(full))
	}
	for _, w := range full {
		g := got[w.Name]
		data := make([]float32, len(g.Bits))
		for i, b := range g.Bits {
			data[i] = math.Float32frombits(uint32(b))
		}
		if !slices.Equal(g.Shape, w.Shape) || !bitsEqual(data, w.Data) {
			t.Errorf("python: tensor %s: shape %v, %d elements; want %v and the written data", w.Name, g.Shape, len(data), w.Shape)
		}
	}
}

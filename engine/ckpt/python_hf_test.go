package ckpt

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/internal/proctest"
)

// pythonHF reads an HF export as transformers' GPT2LMHeadModel would,
// with Debian's torch in place of transformers (not installed here): it
// checks the config.json fields GPT2Config needs, that model.safetensors
// holds exactly GPT2LMHeadModel's parameters under their names and shapes
// (lm_head tied, so absent), then runs GPT-2's forward in float64 as
// modeling_gpt2.py defines it from those fields alone (n_layer, n_head,
// layer_norm_epsilon, gelu_new, Conv1D weights in × out, scaled causal
// attention) and prints the logits of the tokens in argv[2].
const pythonHF = `
import json, math, struct, sys, torch
d, ids = sys.argv[1], json.loads(sys.argv[2])
cfg = json.load(open(d + "/config.json"))
assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
assert cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"] and cfg["scale_attn_weights"], cfg
assert cfg["n_inner"] is None and not cfg["scale_attn_by_inverse_layer_idx"] and not cfg["reorder_and_upcast_attn"], cfg
L, H, C, V, P, eps = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["layer_norm_epsilon"]
assert cfg["n_ctx"] == P
raw = open(d + "/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n]); header.pop("__metadata__")
buf = bytearray(raw[8 + n:])
W = {k: torch.frombuffer(buf, dtype=torch.float32, count=(e["data_offsets"][1] - e["data_offsets"][0]) // 4, offset=e["data_offsets"][0]).reshape(e["shape"]).double() for k, e in header.items()}
want = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C], "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
for i in range(L):
    h = "transformer.h.%d." % i
    want.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C], h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
                 h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C], h + "ln_2.weight": [C], h + "ln_2.bias": [C],
                 h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C], h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C]})
assert {k: list(t.shape) for k, t in W.items()} == want, sorted(set(W) ^ set(want))
def ln(x, p): return torch.nn.functional.layer_norm(x, (C,), W[p + ".weight"], W[p + ".bias"], eps)
def gelu_new(x): return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
T = len(ids)
x = W["transformer.wte.weight"][torch.tensor(ids)] + W["transformer.wpe.weight"][:T]
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
for i in range(L):
    h = "transformer.h.%d." % i
    q, k, v = (ln(x, h + "ln_1") @ W[h + "attn.c_attn.weight"] + W[h + "attn.c_attn.bias"]).split(C, dim=1)
    q, k, v = (t.view(T, H, C // H).transpose(0, 1) for t in (q, k, v))
    att = (q @ k.transpose(1, 2) / math.sqrt(C // H)).masked_fill(~mask, float("-inf")).softmax(-1)
    y = (att @ v).transpose(0, 1).reshape(T, C)
    x = x + y @ W[h + "attn.c_proj.weight"] + W[h + "attn.c_proj.bias"]
    m = gelu_new(ln(x, h + "ln_2") @ W[h + "mlp.c_fc.weight"] + W[h + "mlp.c_fc.bias"])
    x = x + m @ W[h + "mlp.c_proj.weight"] + W[h + "mlp.c_proj.bias"]
print(json.dumps((ln(x, "transformer.ln_f") @ W["transformer.wte.weight"].T).tolist()))
`

// TestHFExportReadByPyTorch: PyTorch, from config.json and
// model.safetensors alone, computes the logits the engine computes: the
// export names, lays out and describes the model as transformers' GPT-2
// expects. (transformers itself is not installed here, so
// GPT2LMHeadModel.from_pretrained does not run in this test.)
func TestHFExportReadByPyTorch(t *testing.T) {
	python := proctest.NeedTorch(t)
	cfg := model.Config{Layers: 2, Heads: 4, Embd: 32, Seq: 24, Vocab: 300}
	root, params := hfRun(t, cfg, "")
	out := filepath.Join(t.TempDir(), "hf")
	_, err := ExportHF(t.Context(), ExportRequest{Op: "ckpt export", From: root, To: out})
	must(t, err)
	ids := []int{5, 299, 17, 0, 256, 42, 42, 7, 123, 64, 3, 200}
	arg, _ := json.Marshal(ids)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", pythonHF, out, string(arg))
	cmd.Stderr = os.Stderr
	js, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	var ref [][]float64
	must(t, json.Unmarshal(js, &ref))
	d, err := model.NewDecoder(cfg, params, backend.CPU{Threads: 1})
	must(t, err)
	if len(ref) != len(ids) {
		t.Fatalf("python gave %d rows of logits, want %d", len(ref), len(ids))
	}
	for pos, id := range ids {
		logits, err := d.Next(id)
		must(t, err)
		var scale, worst float64
		for v, want := range ref[pos] {
			scale = math.Max(scale, math.Abs(want))
			worst = math.Max(worst, math.Abs(float64(logits[v])-want))
		}
		if len(ref[pos]) != cfg.Vocab || worst > 1e-5*scale+1e-7 {
			t.Errorf("position %d: %d logits, off by up to %.3g (largest %.3g)", pos, len(ref[pos]), worst, scale)
		}
	}
}

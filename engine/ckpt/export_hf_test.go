package ckpt

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/internal/usage"
)

// gpt2ConfigJSON is openai-community/gpt2's config.json on the Hugging Face
// hub, the known config the gpt2 preset's is pinned against.
const gpt2ConfigJSON = `{
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
}`

// TestHFConfigGPT2Preset: the config.json of the gpt2 preset has every
// field of GPT-2's own with its value, but the dropout rates (0: the
// engine has none) and the pipeline's task_specific_params; the fields
// GPT-2's file leaves to GPT2Config's defaults are written with those
// defaults (n_inner null, scale_attn_weights, tied embeddings, ...).
func TestHFConfigGPT2Preset(t *testing.T) {
	p := model.Presets["gpt2"]
	cfg := NewHFConfig(JobModel{Layers: p.Layers, Heads: p.Heads, Embd: p.Embd, Seq: p.Seq, Vocab: p.Vocab}, data.GPT2EOT, comm.Float32)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var got, want map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(gpt2ConfigJSON), &want); err != nil {
		t.Fatal(err)
	}
	ours := map[string]any{"attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0}
	for k, v := range want {
		if k == "task_specific_params" {
			continue
		}
		if o, ok := ours[k]; ok {
			v = o
		}
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	defaults := map[string]any{"n_inner": nil, "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false,
		"reorder_and_upcast_attn": false, "tie_word_embeddings": true, "use_cache": true, "torch_dtype": "float32"}
	for k, v := range defaults {
		if g, ok := got[k]; !ok || !reflect.DeepEqual(g, v) {
			t.Errorf("%s = %v (present: %v), want %v", k, g, ok, v)
		}
	}
	if n := len(want) - 1 + len(defaults); len(got) != n {
		t.Errorf("%d fields, want %d: %v", len(got), n, got)
	}
	if bf := NewHFConfig(JobModel{}, 256, comm.BFloat16); bf.TorchDtype != "bfloat16" || bf.BosTokenID != 256 {
		t.Errorf("bf16 export of a byte-level run: torch_dtype %q, bos %d", bf.TorchDtype, bf.BosTokenID)
	}
}

// hfRun writes a one-rank checkpoint of cfg whose job trained on train
// (a token file; "" for the synthetic corpus) and returns its root and
// the parameters.
func hfRun(t *testing.T, cfg model.Config, train string) (string, []float32) {
	t.Helper()
	params := make([]float32, cfg.NumParams())
	model.InitParams(cfg, 9, params)
	var ts []Tensor
	for _, p := range cfg.Params() {
		ts = append(ts, Tensor{Name: p.Name, Shape: p.Shape, Data: params[p.Offset : p.Offset+p.Size()]})
	}
	root := t.TempDir()
	f, err := WriteShard(root, 3, 0, ts, nil)
	must(t, err)
	job, err := json.Marshal(map[string]any{"model": cfg, "data": map[string]any{"train": train}})
	must(t, err)
	must(t, Commit(root, Manifest{Step: 3, Job: job, Layout: Layout{1, 1, 1, 1, 0}, Files: []File{f}}, 0, nil))
	return root, params
}

// TestExportHF: a run on GPT-2 BPE data exports model.safetensors with the
// model's tensors, config.json and the tokenizer files; a byte-level run
// exports no tokenizer files; exporting again replaces the files; a file
// as --out and --optimizer are refused.
func TestExportHF(t *testing.T) {
	dataDir := t.TempDir()
	must(t, data.WriteMeta(filepath.Join(dataDir, data.MetaFile), data.Meta{Tokenizer: "gpt2", VocabSize: 50257, EOT: 50256}))
	cfg := model.Config{Layers: 2, Heads: 2, Embd: 8, Seq: 16, Vocab: 50304}
	root, _ := hfRun(t, cfg, filepath.Join(dataDir, data.TrainFile))
	out := filepath.Join(t.TempDir(), "hf")
	for range 2 {
		res, err := ExportHF(t.Context(), ExportRequest{Op: "ckpt export", From: root, To: out})
		must(t, err)
		if res.Tokenizer != "gpt2" || res.Tensors != len(cfg.Params()) || len(res.Files) != 5 {
			t.Fatalf("export = %+v: want gpt2, %d tensors, 5 files", res, len(cfg.Params()))
		}
	}
	for _, name := range []string{HFWeightsFile, HFConfigFile, data.HFVocabFile, data.HFMergesFile, data.HFTokenizerConfigFile} {
		if fi, err := os.Stat(filepath.Join(out, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	var got HFConfig
	b, err := os.ReadFile(filepath.Join(out, HFConfigFile))
	must(t, err)
	must(t, json.Unmarshal(b, &got))
	if got.NLayer != 2 || got.NHead != 2 || got.NEmbd != 8 || got.NPositions != 16 || got.VocabSize != 50304 || got.EosTokenID != 50256 {
		t.Errorf("config.json = %+v", got)
	}

	byteRoot, _ := hfRun(t, model.Config{Layers: 1, Heads: 1, Embd: 4, Seq: 8, Vocab: 257}, "")
	byteOut := filepath.Join(t.TempDir(), "hf")
	res, err := ExportHF(t.Context(), ExportRequest{Op: "ckpt export", From: byteRoot, To: byteOut, ExportOptions: ExportOptions{DType: comm.BFloat16}})
	must(t, err)
	if res.Tokenizer != "bytes" || len(res.Files) != 2 || res.Config.BosTokenID != 256 || res.Config.TorchDtype != "bfloat16" || res.DType != "BF16" {
		t.Errorf("byte-level export = %+v, config %+v", res, res.Config)
	}
	if _, err := os.Stat(filepath.Join(byteOut, data.HFVocabFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a byte-level export wrote vocab.json (%v)", err)
	}

	// A FIFO where config.json goes is refused, not opened (which would
	// block) nor replaced.
	fifoOut := filepath.Join(t.TempDir(), "hf")
	must(t, os.MkdirAll(fifoOut, 0o755))
	must(t, syscall.Mkfifo(filepath.Join(fifoOut, HFConfigFile), 0o644))
	if _, err := ExportHF(t.Context(), ExportRequest{Op: "ckpt export", From: byteRoot, To: fifoOut}); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("export over a FIFO config.json = %v, want an error naming it", err)
	}
	if fi, err := os.Lstat(filepath.Join(fifoOut, HFConfigFile)); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO was replaced: %v, %v", fi, err)
	}

	file := filepath.Join(t.TempDir(), "model.safetensors")
	must(t, os.WriteFile(file, []byte("x"), 0o644))
	for _, r := range []ExportRequest{
		{Op: "ckpt export", From: root, To: file},
		{Op: "ckpt export", From: root, To: out, ExportOptions: ExportOptions{Optimizer: true}},
	} {
		var ue *usage.Error
		if _, err := ExportHF(t.Context(), r); !errors.As(err, &ue) || !strings.Contains(err.Error(), "hf") {
			t.Errorf("ExportHF to %s (optimizer %v) = %v, want a usage error", r.To, r.Optimizer, err)
		}
	}
}

package generate

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/engine/model"
	"github.com/gtrain/gtrain/internal/usage"
)

var testCfg = model.Config{Layers: 2, Heads: 2, Embd: 16, Seq: 12, Vocab: 257}

// writeRun writes params as the step-5 checkpoint of a two-rank job whose
// ranks each hold a range of every tensor (ZeRO's layout), with the job
// spec a run records, and returns the run's checkpoint directory.
func writeRun(t *testing.T, params []float32) string {
	t.Helper()
	root := t.TempDir()
	job, err := json.Marshal(map[string]any{"model": testCfg, "data": map[string]any{"synthetic": 1000}})
	if err != nil {
		t.Fatal(err)
	}
	var files []ckpt.File
	for r := range 2 {
		var ts []ckpt.Tensor
		for _, p := range testCfg.Params() {
			full := params[p.Offset : p.Offset+p.Size()]
			lo, hi := r*len(full)/2, (r+1)*len(full)/2
			ts = append(ts, ckpt.Tensor{Name: p.Name, Shape: p.Shape, Offset: lo, Data: full[lo:hi]})
		}
		f, err := ckpt.WriteShard(root, 5, r, ts, nil)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	m := ckpt.Manifest{Step: 5, Job: job, Layout: ckpt.Layout{World: 2, DP: 2, TP: 1, PP: 1, ZeroStage: 1}, Files: files}
	if err := ckpt.Commit(root, m, 0, nil); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestRunMatchesDecoder: generate loads a checkpoint split over two ranks
// into the model it was cut from: greedy tokens are the Decoder's on the
// original parameters, decoded with the byte tokenizer of a synthetic run;
// a prompt longer than the context is cropped from the left, and said so.
func TestRunMatchesDecoder(t *testing.T) {
	params := make([]float32, testCfg.NumParams())
	model.InitParams(testCfg, 3, params)
	root := writeRun(t, params)
	var warnings []string
	prompt := "the cat and the river!"
	res, err := Run(context.Background(), Request{Op: "generate", From: root, Prompt: prompt, Tokens: 20, NumSamples: 2,
		Warn: func(s string) { warnings = append(warnings, s) }})
	if err != nil {
		t.Fatal(err)
	}
	cropped := []byte(prompt[len(prompt)-testCfg.Seq:])
	want := make([]int, len(cropped))
	for i, b := range cropped {
		want[i] = int(b)
	}
	if res.Cropped != len(prompt)-testCfg.Seq || !slices.Equal(res.PromptTokens, want) || res.Prompt != string(cropped) || res.Step != 5 || res.Tokenizer != "bytes" {
		t.Errorf("result = %+v; want the prompt cropped to %q, step 5, bytes", res, cropped)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "using its last 12") {
		t.Errorf("warnings = %q, want one about cropping", warnings)
	}
	d, err := model.NewDecoder(testCfg, params, backend.CPU{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := d.Generate(context.Background(), want, model.SampleOptions{Tokens: 20, Vocab: 257}, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 2 || !slices.Equal(res.Samples[0].Tokens, ref) || !slices.Equal(res.Samples[1].Tokens, ref) {
		t.Fatalf("samples = %+v, want twice the decoder's greedy %v", res.Samples, ref)
	}
	toks := make([]uint16, len(ref))
	for i, id := range ref {
		toks[i] = uint16(id)
	}
	if want := data.Decode(toks); res.Samples[0].Text != want {
		t.Errorf("text %q, want the byte tokenizer's %q", res.Samples[0].Text, want)
	}
}

// TestRunSeeded: the same seed gives the same samples; another seed others.
func TestRunSeeded(t *testing.T) {
	params := make([]float32, testCfg.NumParams())
	model.InitParams(testCfg, 4, params)
	root := writeRun(t, params)
	run := func(seed uint64) []Sample {
		res, err := Run(context.Background(), Request{Op: "generate", From: root, Tokens: 30, NumSamples: 3, Temperature: 1, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		return res.Samples
	}
	a, b, c := run(7), run(7), run(8)
	same := func(x, y []Sample) bool {
		return slices.EqualFunc(x, y, func(p, q Sample) bool { return p.Text == q.Text && slices.Equal(p.Tokens, q.Tokens) })
	}
	if !same(a, b) || same(a, c) {
		t.Errorf("seed 7 twice: %v and %v; seed 8: %v", a, b, c)
	}
	if same(a[:1], a[1:2]) {
		t.Errorf("two samples of one request are the same: %v", a[:2])
	}
}

// TestRunRefuses: bad requests are usage errors naming the flag, before the
// checkpoint is read.
func TestRunRefuses(t *testing.T) {
	for _, tt := range []struct {
		r    Request
		want string
	}{
		{Request{Tokens: 0, NumSamples: 1}, "--tokens 0: want 1 to"},
		{Request{Tokens: MaxTokens + 1, NumSamples: 1}, "--tokens"},
		{Request{Tokens: 1, NumSamples: 0}, "--num-samples 0"},
		{Request{Tokens: 1, NumSamples: 1, Temperature: -1}, "--temperature -1"},
		{Request{Tokens: 1, NumSamples: 1, TopK: -2}, "--top-k -2"},
		{Request{Tokens: 1, NumSamples: 1, Tokenizer: "gpt3"}, `--tokenizer "gpt3"`},
		{Request{Tokens: 1, NumSamples: 1, From: "/nonexistent/run"}, "no such directory"},
	} {
		tt.r.Op = "generate"
		_, err := Run(context.Background(), tt.r)
		var ue *usage.Error
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want a usage error with %q", tt.r, err, tt.want)
		}
	}
}

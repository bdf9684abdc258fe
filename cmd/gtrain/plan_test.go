package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/planner"
)

// TestPlanUsageErrors: every bad flag is a one-line usage error (exit 2)
// naming the flag.
func TestPlanUsageErrors(t *testing.T) {
	dir := t.TempDir()
	uneven := filepath.Join(dir, "uneven")
	if err := os.WriteFile(uneven, []byte("a slots=8\nb slots=4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--gpus", "8"}, "no model: give --model NAME, --params N"},
		{[]string{"--model", "gpt2"}, "no cluster: give --gpus N"},
		{[]string{"--model", "gpt-5", "--gpus", "8"}, `--model: model "gpt-5": unknown preset`},
		{[]string{"--model", "gpt2", "--params", "1B", "--gpus", "8"}, "--model and --params both"},
		{[]string{"--params", "lots", "--gpus", "8"}, `--params "lots"`},
		{[]string{"--model", "gpt2", "--gpus", "12"}, "--gpus 12 is not a multiple of --gpus-per-node 8"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--gpu", "tpu"}, `--gpu: gpu "tpu": not in the catalog`},
		{[]string{"--model", "gpt2", "--gpus", "16", "--inter", "ib:4y200"}, "--inter: link"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--tp", "0"}, "--tp 0: must be at least 1"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--zero", "4"}, "--zero 4: want a ZeRO stage 0 to 3"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--recompute", "some"}, `--recompute: recompute "some"`},
		{[]string{"--model", "gpt2", "--gpus", "8", "--efficiency", "1.5"}, "--efficiency 1.5"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--usable-memory", "0"}, "--usable-memory 0"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--precision", "fp8"}, `--precision: precision "fp8"`},
		{[]string{"--model", "gpt2", "--gpus", "8", "--gpu", "V100-32GB"}, "has no bfloat16: use fp16"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--output", "yaml"}, `invalid argument "yaml" for "-o, --output" flag: want text or json`},
		{[]string{"--model", "gpt2", "--gpus", "8", "--topology", "x.json"}, "each describe the cluster"},
		{[]string{"--model", "gpt2", "--topology", "x.json", "--gpu", "H100"}, "--gpu and --topology both"},
		{[]string{"--model", "gpt2", "--topology", filepath.Join(dir, "none.json")}, "none.json: no such file or directory"},
		{[]string{"--model", "gpt2", "--hostfile", uneven}, "a has 8 slots and b 4"},
		{[]string{"--model", "gpt2", "--gpus", "8", "--dp", "3"}, "no tp×pp×dp = 8 GPUs with the pinned degrees"},
		{[]string{"--layers", "4", "--hidden", "100", "--heads", "3", "--gpus", "8"}, "hidden 100: must be a positive multiple of heads (3)"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			code, out, stderr := runMain(t, append([]string{"plan"}, c.args...)...)
			if code != ExitUsage || out != "" || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and one line containing %q", code, out, stderr, c.want)
			}
		})
	}
}

// TestPlanJSON checks the JSON document: the fields the issue names, the
// best layout first, rejects after the feasible ones with their reason.
func TestPlanJSON(t *testing.T) {
	code, out, stderr := runMain(t, "plan", "--model", "gpt3-175b", "--gpus", "64", "--top", "3", "-o", "json", "--explain")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var doc struct {
		Model struct {
			Params float64 `json:"params"`
			Layers int     `json:"layers"`
		} `json:"model"`
		Feasible   int                   `json:"feasible"`
		Best       *planner.Candidate    `json:"best"`
		Candidates []map[string]any      `json:"candidates"`
		Explain    struct{ Ranks []any } `json:"explain"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if doc.Model.Layers != 96 || doc.Model.Params < 174e9 || doc.Model.Params > 176e9 {
		t.Errorf("model: %+v", doc.Model)
	}
	if doc.Best == nil || !doc.Best.Feasible || len(doc.Explain.Ranks) != 64 {
		t.Fatalf("best %+v, %d ranks explained", doc.Best, len(doc.Explain.Ranks))
	}
	if len(doc.Candidates) != 6 {
		t.Fatalf("%d candidates, want 3 feasible + 3 rejected", len(doc.Candidates))
	}
	for _, k := range []string{"tp", "pp", "dp", "zero_stage", "micro_batch", "grad_accum", "recompute", "feasible",
		"memory", "step_time_s", "tflops_per_gpu", "mfu", "bubble_fraction", "comm_bytes"} {
		if _, ok := doc.Candidates[0][k]; !ok {
			t.Errorf("candidate has no %q: %v", k, doc.Candidates[0])
		}
	}
	mem := doc.Candidates[0]["memory"].(map[string]any)
	for _, k := range []string{"params", "grads", "optimizer", "activations", "buffers", "total"} {
		if _, ok := mem[k]; !ok {
			t.Errorf("memory has no %q", k)
		}
	}
	if last := doc.Candidates[5]; last["feasible"] != false || last["reject_reason"] == "" {
		t.Errorf("last candidate should be a reject with a reason: %v", last)
	}
}

// TestPlanNothingFits: exit 1, the closest misses on stdout with reasons,
// one line on stderr saying what to change.
func TestPlanNothingFits(t *testing.T) {
	code, out, stderr := runMain(t, "plan", "--model", "megatron-1t", "--gpus", "8")
	if code != ExitFailure {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(out, "no layout fits; the 10 closest:") || !strings.Contains(out, "NO: needs") {
		t.Errorf("stdout lacks the closest misses:\n%s", out)
	}
	if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "gtrain: plan: no layout fits on 8 × A100-80GB") ||
		!strings.Contains(stderr, "add GPUs") {
		t.Errorf("stderr: %q", stderr)
	}
}

// TestPlanTopologyAndHostfile: a topology file and a hostfile describe the
// same cluster as --gpus, so the plans agree.
func TestPlanTopologyAndHostfile(t *testing.T) {
	dir := t.TempDir()
	e := planner.Catalog["H100"]
	top := planner.Topology{Nodes: 2, GPUsPerNode: 8, GPU: e.GPU, Intra: e.Intra, Inter: e.Inter}
	b, _ := json.Marshal(top)
	topFile, hostfile := filepath.Join(dir, "top.json"), filepath.Join(dir, "hosts")
	if err := os.WriteFile(topFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostfile, []byte("n0 slots=8\nn1 slots=8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plan := func(args ...string) string {
		t.Helper()
		code, out, stderr := runMain(t, append([]string{"plan", "--model", "llama2-13b", "--top", "1"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		return out[strings.Index(out, "\n")+1:] // the model line is the same by construction
	}
	want := plan("--gpus", "16", "--gpu", "H100")
	for _, args := range [][]string{{"--topology", topFile}, {"--hostfile", hostfile, "--gpu", "H100"}} {
		if got := plan(args...); got != want {
			t.Errorf("%v:\n%s\nwant (from --gpus):\n%s", args, got, want)
		}
	}
}

// TestPlanPinnedAll: with every knob pinned exactly one layout is
// evaluated, and --explain shows its grid.
func TestPlanPinnedAll(t *testing.T) {
	code, out, stderr := runMain(t, "plan", "--model", "megatron-146b", "--gpus", "1536", "--tp", "8", "--pp", "8",
		"--dp", "24", "--zero", "0", "--micro-batch", "1", "--recompute", "full", "--virtual-stages", "1", "--explain", "--sequence-parallel=false")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"searched: 1 layouts evaluated", "\n*  8   8   1    24  0     1    96  full ",
		"rank 8     node 1    dp 0    pp 1    tp 0", "groups of rank 0: TP {0, 1, 2, 3, 4, 5, …, 7}, PP {0, 8, 16, 24, 32, 40, …, 56}"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
)

// ckptTensors are the tensors of a test checkpoint at step: a parameter
// and its optimizer moment, values derived from the step.
func ckptTensors(step int64) []ckpt.Tensor {
	var out []ckpt.Tensor
	for k, name := range []string{"transformer.wte.weight", "optimizer.exp_avg.transformer.wte.weight"} {
		data := make([]float32, 12)
		for i := range data {
			data[i] = float32(step*100 + int64(k*20+i))
		}
		out = append(out, ckpt.Tensor{Name: name, Shape: []int{4, 3}, Data: data})
	}
	return out
}

// writeCkpt writes step's checkpoint under root from two ranks that split
// every tensor at element 5.
func writeCkpt(t *testing.T, root string, step int64) {
	t.Helper()
	full := ckptTensors(step)
	var files []ckpt.File
	for r, span := range [][2]int{{0, 5}, {5, 12}} {
		var shard []ckpt.Tensor
		for _, x := range full {
			shard = append(shard, ckpt.Tensor{Name: x.Name, Shape: x.Shape, Offset: span[0], Data: x.Data[span[0]:span[1]]})
		}
		f, err := ckpt.WriteShard(root, step, r, shard, []byte(`{"rank":0}`))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	m := ckpt.Manifest{Step: step, Job: json.RawMessage(`{"steps":400}`), Layout: ckpt.Layout{World: 2, DP: 2, TP: 1, PP: 1}, Files: files}
	if err := ckpt.Commit(root, m, 0, nil); err != nil {
		t.Fatal(err)
	}
}

// ckptRoot holds steps 100 and 200 (valid), 300 (a flipped byte in rank 1's
// file) and 400 (rank 0's file only: never committed).
func ckptRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, s := range []int64{100, 200, 300} {
		writeCkpt(t, root, s)
	}
	path := filepath.Join(root, "step-00000300", "rank-00001.safetensors")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ckpt.WriteShard(root, 400, 0, ckptTensors(400), nil); err != nil {
		t.Fatal(err)
	}
	return root
}

// runMain runs gtrain in process and returns its exit code, stdout and
// stderr.
func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	ios := &IOStreams{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(string) string { return "" }}
	code := Main(args, ios)
	return code, out.String(), errb.String()
}

// TestCkptLs lists a root with valid, corrupted and uncommitted step
// directories, as a table and as JSON, and one step directory.
func TestCkptLs(t *testing.T) {
	root := ckptRoot(t)
	code, out, stderr := runMain(t, "ckpt", "ls", root)
	if code != ExitOK || stderr != "" {
		t.Fatalf("ckpt ls: exit %d, stderr %q", code, stderr)
	}
	for _, re := range []string{
		`(?m)^STEP +DIRECTORY +CREATED +SIZE +FILES +STATUS$`,
		`(?m)^100 +step-00000100 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +\d+ B +2 +valid$`,
		`(?m)^200 +step-00000200 +\S+ \S+ +\d+ B +2 +valid, latest$`,
		`(?m)^300 +step-00000300 +\S+ \S+ +\d+ B +2 +INVALID: rank-00001\.safetensors: sha256 mismatch: .*disk or copy corruption\)$`,
		`(?m)^400 +step-00000400 +- +\d+ B +1 +INVALID: no manifest\.json: never committed`,
		`(?m)^2 of 4 valid; latest: ` + regexp.QuoteMeta(filepath.Join(root, "step-00000200")) + `\n\z`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("ckpt ls: no match for %s in:\n%s", re, out)
		}
	}

	code, out, _ = runMain(t, "ckpt", "ls", "-o", "json", root)
	var doc struct {
		Latest      *string
		Checkpoints []struct {
			Step          int64
			Valid, Latest bool
			Reason        string
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != ExitOK || len(doc.Checkpoints) != 4 {
		t.Fatalf("ckpt ls -o json: exit %d, %v:\n%s", code, err, out)
	}
	if doc.Latest == nil || *doc.Latest != filepath.Join(root, "step-00000200") || !doc.Checkpoints[1].Latest || doc.Checkpoints[0].Latest ||
		doc.Checkpoints[2].Valid || !strings.Contains(doc.Checkpoints[2].Reason, "sha256 mismatch") {
		t.Errorf("ckpt ls -o json:\n%s", out)
	}

	code, out, _ = runMain(t, "ckpt", "ls", filepath.Join(root, "step-00000100"))
	if code != ExitOK || strings.Count(out, "\n") != 3 || !strings.Contains(out, "valid, latest") {
		t.Errorf("ckpt ls STEPDIR: exit %d:\n%s", code, out)
	}
	code, _, stderr = runMain(t, "ckpt", "ls", filepath.Join(root, "none"))
	if code != ExitUsage || !strings.Contains(stderr, "none: no such directory") {
		t.Errorf("ckpt ls of a missing root: exit %d, %q", code, stderr)
	}
}

// TestCkptVerify verifies a valid and a corrupted step directory, and a
// root with and without invalid ones.
func TestCkptVerify(t *testing.T) {
	root := ckptRoot(t)
	step := func(s string) string { return filepath.Join(root, "step-00000"+s) }

	code, out, stderr := runMain(t, "ckpt", "verify", step("100"))
	if code != ExitOK || stderr != "" || !regexp.MustCompile(`^step-00000100  valid \(2 files, \d+ B\)\n$`).MatchString(out) {
		t.Errorf("verify a valid step: exit %d, stdout %q, stderr %q", code, out, stderr)
	}

	code, out, stderr = runMain(t, "ckpt", "verify", step("300"))
	if code != ExitFailure || !strings.HasPrefix(out, "step-00000300  INVALID: rank-00001.safetensors: sha256 mismatch") ||
		!strings.HasPrefix(stderr, "gtrain: ckpt verify: step-00000300: rank-00001.safetensors: sha256 mismatch") ||
		!strings.Contains(stderr, "an invalid checkpoint is never loaded") {
		t.Errorf("verify a corrupted step: exit %d\nstdout %q\nstderr %q", code, out, stderr)
	}

	code, out, stderr = runMain(t, "ckpt", "verify", root)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != ExitFailure || len(lines) != 4 || !strings.HasPrefix(lines[3], "step-00000400  INVALID: no manifest.json") ||
		!strings.HasPrefix(stderr, "gtrain: ckpt verify: 2 of 4 checkpoints invalid, first step-00000300: rank-00001.safetensors: sha256 mismatch") {
		t.Errorf("verify a root: exit %d\nstdout:\n%s\nstderr %q", code, out, stderr)
	}

	for _, s := range []string{"300", "400"} {
		if err := os.RemoveAll(step(s)); err != nil {
			t.Fatal(err)
		}
	}
	if code, out, _ = runMain(t, "ckpt", "verify", root); code != ExitOK || strings.Count(out, "valid (") != 2 {
		t.Errorf("verify a valid root: exit %d:\n%s", code, out)
	}
	if code, doc := verifyJSON(t, root); code != ExitOK || !doc.Valid || len(doc.Checkpoints) != 2 {
		t.Errorf("verify -o json a valid root: exit %d, %+v", code, doc)
	}
}

// TestCkptVerifyJSON: verify -o json prints one document with every
// checkpoint's verdict and exits as the text form does.
func TestCkptVerifyJSON(t *testing.T) {
	root := ckptRoot(t)
	code, doc := verifyJSON(t, root)
	if code != ExitFailure || doc.Valid || doc.Path != root || len(doc.Checkpoints) != 4 {
		t.Fatalf("verify -o json: exit %d, %+v", code, doc)
	}
	for i, valid := range []bool{true, true, false, false} {
		c := doc.Checkpoints[i]
		if c.Valid != valid || (c.Reason == "") != valid || c.Step != int64(100*(i+1)) {
			t.Errorf("checkpoint %d: %+v, want valid %v", i, c, valid)
		}
	}
	if code, doc = verifyJSON(t, filepath.Join(root, "step-00000100")); code != ExitOK || !doc.Valid || len(doc.Checkpoints) != 1 {
		t.Errorf("verify -o json a valid step: exit %d, %+v", code, doc)
	}
}

// verifyJSON runs ckpt verify -o json on path and decodes its document.
func verifyJSON(t *testing.T, path string) (int, verifyDoc) {
	t.Helper()
	code, out, _ := runMain(t, "ckpt", "verify", "-o", "json", path)
	var doc verifyDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("ckpt verify -o json %s: exit %d, %v:\n%s", path, code, err, out)
	}
	return code, doc
}

// verifyDoc is ckpt verify's JSON document.
type verifyDoc struct {
	Path        string
	Valid       bool
	Checkpoints []struct {
		Step   int64
		Valid  bool
		Reason string
	}
}

// TestCkptExport exports a root's latest valid checkpoint (warning about
// the newer invalid ones) and a step directory as bf16 with the optimizer
// state, refuses a corrupted one, and reports usage errors.
func TestCkptExport(t *testing.T) {
	root := ckptRoot(t)
	out := filepath.Join(t.TempDir(), "model.safetensors")

	code, stdout, stderr := runMain(t, "ckpt", "export", root, "--out", out)
	if code != ExitOK || !strings.HasPrefix(stdout, "exported step-00000200 (step 200) to "+out+": 1 tensor(s), 12 elements, ") ||
		!strings.Contains(stderr, "gtrain: warning: ckpt: skipping step-00000400: no manifest.json") ||
		!strings.Contains(stderr, "gtrain: warning: ckpt: skipping step-00000300: rank-00001.safetensors: sha256 mismatch") {
		t.Fatalf("export the latest: exit %d\nstdout %q\nstderr %q", code, stdout, stderr)
	}
	checkExported(t, out, 200, "F32", []string{"transformer.wte.weight"})

	code, stdout, stderr = runMain(t, "ckpt", "export", filepath.Join(root, "step-00000100"), "--out", out, "--dtype", "bf16", "--optimizer")
	if code != ExitOK || stderr != "" || !strings.Contains(stdout, "2 tensor(s), 24 elements") || !strings.HasSuffix(stdout, " as BF16\n") {
		t.Fatalf("export a step as bf16: exit %d\nstdout %q\nstderr %q", code, stdout, stderr)
	}
	checkExported(t, out, 100, "BF16", []string{"optimizer.exp_avg.transformer.wte.weight", "transformer.wte.weight"})

	code, stdout, _ = runMain(t, "ckpt", "export", root, "--out", out, "--dtype", "F16", "-o", "json")
	var doc struct {
		Checkpoint, Path, DType string
		Step, Elements, Bytes   int64
		Tensors                 int
	}
	fi, err := os.Stat(out)
	if jerr := json.Unmarshal([]byte(stdout), &doc); code != ExitOK || jerr != nil || err != nil {
		t.Fatalf("export -o json: exit %d, %v, %v:\n%s", code, jerr, err, stdout)
	}
	if doc.Checkpoint != filepath.Join(root, "step-00000200") || doc.Path != out || doc.DType != "F16" ||
		doc.Step != 200 || doc.Tensors != 1 || doc.Elements != 12 || doc.Bytes != fi.Size() {
		t.Errorf("export -o json: %+v; file of %d bytes", doc, fi.Size())
	}
	checkExported(t, out, 200, "F16", []string{"transformer.wte.weight"})

	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	code, _, stderr = runMain(t, "ckpt", "export", filepath.Join(root, "step-00000300"), "--out", bad)
	if _, err := os.Stat(bad); code != ExitFailure || err == nil ||
		!strings.HasPrefix(stderr, "gtrain: ckpt export: ckpt: verify step-00000300/rank-00001.safetensors: sha256 mismatch") {
		t.Errorf("export a corrupted step: exit %d, stderr %q, file: %v", code, stderr, err)
	}
	for _, tc := range []struct {
		args   []string
		code   int
		reason string
	}{
		{[]string{root}, ExitUsage, "ckpt export: --out FILE is required"},
		{[]string{root, "--out", bad, "--dtype", "int8"}, ExitUsage, `--dtype: unknown dtype "int8" (want float32, bfloat16 or float16)`},
		{[]string{filepath.Join(root, "none"), "--out", bad}, ExitUsage, "none: no such directory"},
		{[]string{t.TempDir(), "--out", bad}, ExitFailure, "ckpt export: ckpt: no valid checkpoint in "},
		{[]string{root, "-o", bad}, ExitUsage, `invalid argument "` + bad + `" for "-o, --output" flag: want text or json`},
	} {
		code, _, stderr := runMain(t, append([]string{"ckpt", "export"}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.reason) {
			t.Errorf("export %v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr, tc.code, tc.reason)
		}
	}
}

// checkExported reads an exported file back: the names, the dtype, the full
// shape, and (for F32) the values.
func checkExported(t *testing.T, path string, step int64, dtype string, names []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ckpt.ReadHeader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range h.Entries {
		got = append(got, e.Name)
		if e.DType != dtype || !slices.Equal(e.Shape, []int{4, 3}) {
			t.Errorf("%s: %s %v, want %s [4 3]", e.Name, e.DType, e.Shape, dtype)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, names) || h.Metadata["format"] != "pt" {
		t.Errorf("exported %v (metadata %v), want %v", got, h.Metadata, names)
	}
	if dtype == "F32" {
		e, _ := h.Entry(names[0])
		data := b[h.DataStart+e.Begin : h.DataStart+e.End]
		want := ckptTensors(step)[0].Data
		for i, f := range want {
			if g := data[4*i : 4*i+4]; !bytes.Equal(g, f32le(f)) {
				t.Fatalf("element %d: % x, want %v", i, g, f)
			}
		}
	}
}

func f32le(f float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(f)) }

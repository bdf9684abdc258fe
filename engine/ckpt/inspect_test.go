package ckpt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/usage"
)

// mixedRoot holds steps 100 and 200 (valid), 300 (a flipped byte in rank
// 1's file) and 400 (rank 0's file only: never committed).
func mixedRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, s := range []int64{100, 200, 300} {
		mustWrite(t, root, s, 2, 0)
	}
	path := filepath.Join(root, StepDirName(300), RankFileName(1))
	b, err := os.ReadFile(path)
	must(t, err)
	b[len(b)-1] ^= 1
	must(t, os.WriteFile(path, b, 0o644))
	_, err = WriteShard(root, 400, 0, fullTensors(400, 1), nil)
	must(t, err)
	return root
}

// TestResolveArg: a path that is no directory is a usage error naming the
// command and the path; a root or a step directory resolves as Resolve does.
func TestResolveArg(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 1, 1, 0)
	file := filepath.Join(root, "notes.txt")
	must(t, os.WriteFile(file, nil, 0o644))
	for _, tc := range []struct {
		path, want string
	}{
		{filepath.Join(root, "none"), "resume: " + filepath.Join(root, "none") + ": no such directory"},
		{file, "resume: " + file + ": not a directory: give a checkpoint directory or one of its step directories"},
	} {
		_, err := ResolveArg("resume", tc.path)
		var ue *usage.Error
		if !errors.As(err, &ue) || err.Error() != tc.want {
			t.Errorf("ResolveArg(%s) = %v, want the usage error %q", tc.path, err, tc.want)
		}
	}
	step := filepath.Join(root, StepDirName(1))
	if got, err := ResolveArg("resume", step); err != nil || got != (Target{Root: root, Step: step}) {
		t.Errorf("ResolveArg(step) = %+v, %v", got, err)
	}
}

// TestInspect lists a root of valid, corrupted and uncommitted step
// directories, and one step directory, and gives each its verdict.
func TestInspect(t *testing.T) {
	root := mixedRoot(t)
	inv, err := Inspect(t.Context(), "ckpt ls", root)
	must(t, err)
	if len(inv.Checkpoints) != 4 || inv.Path != root || inv.Latest() != 1 || inv.NumValid() != 2 {
		t.Fatalf("Inspect(root) = %+v: latest %d, %d valid; want 4 checkpoints, latest 1, 2 valid", inv, inv.Latest(), inv.NumValid())
	}
	for i, reason := range []string{"", "", RankFileName(1) + ": sha256 mismatch", "no manifest.json: never committed"} {
		if info := inv.Checkpoints[i]; info.Valid != (reason == "") || !strings.HasPrefix(info.Reason, reason) {
			t.Errorf("checkpoint %d: valid %v, reason %q; want %q", i, info.Valid, info.Reason, reason)
		}
	}
	want := "ckpt verify: 2 of 4 checkpoints invalid, first step-00000300: rank-00001.safetensors: sha256 mismatch"
	if err := inv.Check("ckpt verify"); err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), invalidHint) {
		t.Errorf("Check = %v, want %q ... %q", err, want, invalidHint)
	}

	one, err := Inspect(t.Context(), "ckpt verify", filepath.Join(root, StepDirName(300)))
	must(t, err)
	want = "ckpt verify: step-00000300: rank-00001.safetensors: sha256 mismatch"
	if err := one.Check("ckpt verify"); len(one.Checkpoints) != 1 || one.Latest() != -1 || err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Inspect(step 300) = %+v, Check %v; want one invalid checkpoint and %q", one, err, want)
	}
	good, err := Inspect(t.Context(), "ckpt verify", filepath.Join(root, StepDirName(100)))
	if err != nil || good.Check("ckpt verify") != nil || good.Latest() != 0 {
		t.Errorf("Inspect(step 100) = %+v, %v; want one valid checkpoint", good, err)
	}
	empty, err := Inspect(t.Context(), "ckpt verify", t.TempDir())
	if err != nil || len(empty.Checkpoints) != 0 || empty.Latest() != -1 ||
		empty.Check("ckpt verify") == nil || empty.Check("ckpt verify").Error() != "ckpt verify: no checkpoints in "+empty.Path {
		t.Errorf("Inspect(empty) = %+v, %v; Check %v", empty, err, empty.Check("ckpt verify"))
	}
	var ue *usage.Error
	if _, err := Inspect(t.Context(), "ckpt ls", filepath.Join(root, "none")); !errors.As(err, &ue) {
		t.Errorf("Inspect(missing) = %v, want a usage error", err)
	}
}

// TestInspectInterrupted: an inspection cut short by the end of its
// context returns the context's cause itself, naming no file.
func TestInspectInterrupted(t *testing.T) {
	root := mixedRoot(t)
	for _, path := range []string{root, filepath.Join(root, StepDirName(100))} {
		ctx, cancel := context.WithCancelCause(t.Context())
		cause := &testInterrupt{}
		cancel(cause)
		if _, err := Inspect(ctx, "ckpt ls", path); err != error(cause) {
			t.Errorf("Inspect(%s) interrupted = %v, want the cause alone", path, err)
		}
	}
}

// TestExportPath exports a root's newest valid checkpoint, warning of the
// newer invalid ones, and reports what it wrote; it refuses an invalid
// checkpoint, a missing one and a destination that is no regular file.
func TestExportPath(t *testing.T) {
	root := mixedRoot(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "m.safetensors")
	var w warnings
	res, err := ExportPath(t.Context(), ExportRequest{Op: "ckpt export", From: root, To: out, ExportOptions: ExportOptions{DType: comm.BFloat16}, Warn: w.warn})
	must(t, err)
	fi, err := os.Stat(out)
	must(t, err)
	var elems int64
	for _, x := range fullTensors(200, 1)[:3] { // the parameters
		elems += int64(len(x.Data))
	}
	want := Exported{Checkpoint: filepath.Join(root, StepDirName(200)), Step: 200, Path: out, Tensors: 3, Elements: elems, Bytes: fi.Size(), DType: "BF16"}
	if res != want {
		t.Errorf("ExportPath = %+v, want %+v", res, want)
	}
	if s := w.String(); !strings.Contains(s, "ckpt: skipping step-00000400: no manifest.json") || !strings.Contains(s, "ckpt: skipping step-00000300: ") {
		t.Errorf("warned %q, want both newer step directories named", s)
	}
	res, err = ExportPath(t.Context(), ExportRequest{Op: "ckpt export", From: filepath.Join(root, StepDirName(100)), To: out, ExportOptions: ExportOptions{Optimizer: true}})
	if err != nil || res.Tensors != len(testShapes) || res.DType != "F32" || res.Step != 100 {
		t.Errorf("ExportPath(step 100, optimizer) = %+v, %v", res, err)
	}

	fifo := filepath.Join(dir, "pipe")
	must(t, syscall.Mkfifo(fifo, 0o644))
	for _, tc := range []struct {
		from, to string
		usage    bool
		prefix   string
	}{
		{filepath.Join(root, StepDirName(300)), out, false, "ckpt export: ckpt: verify step-00000300/rank-00001.safetensors: sha256 mismatch"},
		{filepath.Join(root, "none"), out, true, "ckpt export: " + filepath.Join(root, "none") + ": no such directory"},
		{t.TempDir(), out, false, "ckpt export: ckpt: no valid checkpoint in "},
		{root, fifo, true, "ckpt export: " + fifo + " is a FIFO (named pipe), not a regular file"},
	} {
		_, err := ExportPath(t.Context(), ExportRequest{Op: "ckpt export", From: tc.from, To: tc.to})
		var ue *usage.Error
		if err == nil || !strings.HasPrefix(err.Error(), tc.prefix) || errors.As(err, &ue) != tc.usage {
			t.Errorf("ExportPath(%s to %s) = %v; want %q (a usage error: %v)", tc.from, tc.to, err, tc.prefix, tc.usage)
		}
	}
	if !strings.HasSuffix(mustErr(ExportPath(t.Context(), ExportRequest{Op: "ckpt export", From: filepath.Join(root, StepDirName(300)), To: out})), invalidHint) {
		t.Error("an invalid checkpoint's export error does not end with the hint")
	}
}

// mustErr is the text of err, "" when nil.
func mustErr(_ Exported, err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package ckpt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// testInterrupt stands for the launcher's *InterruptedError: the cause with
// which a command's context ends on Ctrl-C.
type testInterrupt struct{}

func (*testInterrupt) Error() string { return "interrupted by SIGINT" }

// TestStopsWhenContextEnds: verifying, listing, finding the latest and
// exporting a checkpoint of several MiB stop at once when their context has
// ended, and after the first chunk read when it ends while they read,
// returning an error that wraps the context's cause. An interrupted export
// leaves the destination as it was and no temporary file.
func TestStopsWhenContextEnds(t *testing.T) {
	root := t.TempDir()
	const scale = 8000 // about 10 MB in two rank files: rank 1's is 7 chunks
	if err := writeCheckpoint(root, 1, 2, scale, 0, nil); err != nil {
		t.Fatal(err)
	}
	step := filepath.Join(root, StepDirName(1))
	c, err := Open(t.Context(), step)
	must(t, err)
	outDir := t.TempDir()
	out := filepath.Join(outDir, "model.safetensors")
	must(t, os.WriteFile(out, []byte("old"), 0o644))

	ops := []struct {
		name string
		run  func(ctx context.Context, w *warnings) error
	}{
		{"Verify", func(ctx context.Context, _ *warnings) error { return Verify(ctx, step) }},
		{"List", func(ctx context.Context, _ *warnings) error {
			infos, err := List(ctx, root)
			if err == nil {
				t.Errorf("List = %+v, want no result", infos)
			}
			return err
		}},
		{"Describe", func(ctx context.Context, _ *warnings) error {
			_, err := Describe(ctx, step)
			return err
		}},
		{"Latest", func(ctx context.Context, w *warnings) error {
			got, err := Latest(ctx, root, w.warn)
			if got != nil || errors.Is(err, ErrNoCheckpoint) {
				t.Errorf("Latest = %v, %v; want no checkpoint and not ErrNoCheckpoint (the search was cut short)", got, err)
			}
			return err
		}},
		{"Load", func(ctx context.Context, w *warnings) error {
			_, err := Target{Root: root}.Load(ctx, w.warn)
			return err
		}},
		{"Export", func(ctx context.Context, _ *warnings) error {
			return Export(ctx, c, out, ExportOptions{Optimizer: true})
		}},
	}
	for _, op := range ops {
		for _, mode := range []struct {
			name  string
			after int // chunks read before the context is cancelled
		}{{"already cancelled", 0}, {"cancelled while reading", 1}} {
			t.Run(op.name+" "+mode.name, func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				cause := &testInterrupt{}
				chunks := 0
				testHookChunk = func() {
					if chunks++; chunks == mode.after {
						cancel(cause)
					}
				}
				defer func() { testHookChunk = nil }()
				if mode.after == 0 {
					cancel(cause)
				}
				var w warnings
				err := op.run(ctx, &w)
				var got *testInterrupt
				if !errors.As(err, &got) || got != cause {
					t.Fatalf("error %v, want one wrapping the context's cause", err)
				}
				if chunks != mode.after {
					t.Errorf("read %d chunks, want %d: it did not stop at the first chunk after the context ended", chunks, mode.after)
				}
				if w.String() != "" {
					t.Errorf("warned %q: a verification cut short is no invalid checkpoint", w.String())
				}
				checkUntouched(t, outDir, out, "old")
			})
		}
	}
}

// checkUntouched fails unless dir holds only out, with content want.
func checkUntouched(t *testing.T, dir, out, want string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	if len(ents) != 1 || ents[0].Name() != filepath.Base(out) {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %v, want only %s (a temporary file was left behind)", dir, names, filepath.Base(out))
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != want {
		t.Errorf("%s: %q, %v; want %q untouched", out, b, err, want)
	}
}

// TestExportAfterInterruptedOne: an export that runs to its end after one
// was interrupted writes the whole file.
func TestExportAfterInterruptedOne(t *testing.T) {
	root := t.TempDir()
	must(t, writeCheckpoint(root, 1, 2, 8000, 0, nil))
	c, err := Latest(t.Context(), root, nil)
	must(t, err)
	out := filepath.Join(t.TempDir(), "model.safetensors")
	ctx, cancel := context.WithCancelCause(t.Context())
	testHookChunk = func() { cancel(&testInterrupt{}) }
	defer func() { testHookChunk = nil }()
	if err := Export(ctx, c, out, ExportOptions{}); !errors.As(err, new(*testInterrupt)) {
		t.Fatalf("interrupted export: %v", err)
	}
	testHookChunk = nil
	must(t, Export(t.Context(), c, out, ExportOptions{}))
	got, _ := readExport(t, out)
	for _, want := range fullTensors(1, 8000)[:3] { // the parameters
		if !slices.Equal(got[want.Name].bits, wantBits(want.Data, "F32")) {
			t.Errorf("tensor %s differs from the checkpoint's", want.Name)
		}
	}
}

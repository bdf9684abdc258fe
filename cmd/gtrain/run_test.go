package main

import (
	"bytes"
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/train"
)

// parseRun parses args as gtrain run's flags into the options runRun gets.
func parseRun(t *testing.T, out *bytes.Buffer, args ...string) *RunOptions {
	t.Helper()
	ios := &IOStreams{In: strings.NewReader(""), Out: out, Err: new(bytes.Buffer), Getenv: func(string) string { return "" }}
	var opts *RunOptions
	cmd := NewCmdRun(ios, newSignals(nil), func(_ context.Context, o *RunOptions) error { opts = o; return nil })
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	return opts
}

// snapshot copies o deeply enough for reflect.DeepEqual to see any change
// a run makes to it. Getenv is left out (DeepEqual finds no two funcs
// equal) after checking it is still the environment the command was given.
func snapshot(t *testing.T, o *RunOptions) RunOptions {
	t.Helper()
	if o.Getenv == nil || o.Getenv("HOME") != o.IO.Getenv("HOME") {
		t.Fatalf("the launch request's Getenv is not the command's")
	}
	c := *o
	c.Getenv = nil
	c.Command, c.Env, c.Sets = append([]string(nil), o.Command...), append([]string(nil), o.Env...), append([]string(nil), o.Sets...)
	return c
}

// TestRunLeavesOptionsAsParsed: run and resume of the built-in engine
// decide the ranks' command, environment and world size without writing
// them into the parsed options (they once rewrote Command, Env, RunID and
// NprocPerNode): the launch options are built once, from the options and
// what the engine's preparation returns.
func TestRunLeavesOptionsAsParsed(t *testing.T) {
	dir := t.TempDir()
	spec := train.DefaultSpec()
	spec.Model = train.ModelSpec{Preset: "test"}
	spec.Data.Synthetic, spec.Steps, spec.Threads = 20_000, 2, 1
	spec.Batch = train.BatchSpec{MicroBatch: 1, Seq: 16, GradAccum: 1}
	spec.Checkpoint = train.CkptSpec{Dir: filepath.Join(dir, "ckpt"), Every: 2}
	spec.Eval.Every = 0
	if _, err := train.Run(t.Context(), spec, train.Env{World: 1}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		run  func(context.Context, *RunOptions) error
		want string // in the printed plan
	}{
		{"run", []string{"--set", "checkpoint.dir=" + filepath.Join(dir, "other")}, runRun, "gtrain worker\n"},
		{"resume", nil, func(ctx context.Context, o *RunOptions) error {
			return resumeRun(ctx, o, filepath.Join(dir, "ckpt"), false)
		}, "gtrain worker --resume\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			o := parseRun(t, &out, append([]string{"--dry-run", "--env", "A=1"}, tc.args...)...)
			before := snapshot(t, o)
			if err := tc.run(t.Context(), o); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tc.want) || !strings.Contains(out.String(), "GTRAIN_JOB_SPEC=") {
				t.Errorf("plan printed:\n%s\nwant %q and the job spec in it", out.String(), tc.want)
			}
			if after := snapshot(t, o); !reflect.DeepEqual(before, after) {
				t.Errorf("%s rewrote its options:\nbefore %+v\nafter  %+v", tc.name, before, after)
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/launch"
)

func TestValCount(t *testing.T) {
	tests := []struct {
		name string
		frac float64
		n    int64
		want int64
	}{
		{"rounded", 0.1, 95, 10},
		{"at least one", 0.1, 3, 1},
		{"never all", 0.9, 2, 1},
		{"half", 0.5, 10, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := valCount(tt.frac, tt.n); got != tt.want {
				t.Errorf("valCount(%v, %d) = %d, want %d", tt.frac, tt.n, got, tt.want)
			}
		})
	}
}

// TestDataPrepareInterrupted: a prepare stopped by a signal returns the
// interrupt (exit 128+n) and leaves neither token files nor temporary files.
func TestDataPrepareInterrupted(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(in, []byte(strings.Repeat("text ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(&launch.InterruptedError{Signal: syscall.SIGINT})
	var stdout, stderr bytes.Buffer
	o := &DataPrepareOptions{IO: &IOStreams{Out: &stdout, Err: &stderr}, Inputs: []string{in}, Out: out, ValFraction: 0.1, Output: "text"}
	err := dataPrepareRun(ctx, o)
	var intr *launch.InterruptedError
	if !errors.As(err, &intr) || ExitCode(err) != 130 {
		t.Fatalf("dataPrepareRun = %v (exit %d), want the interrupt, exit 130", err, ExitCode(err))
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("an interrupted prepare left %v in %s", entries, out)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", stdout.String())
	}
}

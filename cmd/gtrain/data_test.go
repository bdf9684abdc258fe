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

// TestDataPrepareInterrupted: a prepare stopped by a signal returns the
// interrupt (exit 128+n) and prints no report (engine/data's
// TestPrepareInterrupted checks that nothing is left on disk).
func TestDataPrepareInterrupted(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(in, []byte(strings.Repeat("text ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(&launch.InterruptedError{Signal: syscall.SIGINT})
	var stdout, stderr bytes.Buffer
	o := &DataPrepareOptions{IO: &IOStreams{Out: &stdout, Err: &stderr}, Inputs: []string{in}, Out: filepath.Join(dir, "out"), ValFraction: 0.1, Output: "text"}
	err := dataPrepareRun(ctx, o)
	var intr *launch.InterruptedError
	if !errors.As(err, &intr) || ExitCode(err) != 130 {
		t.Fatalf("dataPrepareRun = %v (exit %d), want the interrupt, exit 130", err, ExitCode(err))
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", stdout.String())
	}
}

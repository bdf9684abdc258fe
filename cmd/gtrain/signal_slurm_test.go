package main

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/launch"
)

// TestSignalsRepeatedUSR1: Slurm's SIGUSR1 arriving again at a worker
// (Slurm signals every process of a step, and the agent forwards it too)
// is the same warning: it does not interrupt the save; another signal
// still does.
func TestSignalsRepeatedUSR1(t *testing.T) {
	t.Run("worker", func(t *testing.T) {
		r := newRelayed(t, true)
		r.send(syscall.SIGUSR1)
		r.send(syscall.SIGUSR1)
		r.send(syscall.SIGTERM)
		if !closed(r.ctx.Done()) {
			t.Fatal("SIGTERM after the warnings did not cancel ctx")
		}
		var ie *launch.InterruptedError
		if err := context.Cause(r.ctx); !errors.As(err, &ie) || ie.Signal != syscall.SIGTERM {
			t.Fatalf("cause = %v, want SIGTERM's interruption (a repeated SIGUSR1 cancelled it)", err)
		}
		if !notClosed(r.abort) {
			t.Fatal("abort closed")
		}
	})
}

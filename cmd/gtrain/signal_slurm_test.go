package main

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/launch"
)

// TestSignalsRepeatedPreemption: a preemption signal arriving again at a
// worker that is saving (a scheduler signals every process of a job step,
// the agent forwards what it got, the launcher stops the ranks too) does
// not interrupt the save, whichever of SIGTERM and SIGUSR1 it is; a
// SIGINT still does.
func TestSignalsRepeatedPreemption(t *testing.T) {
	for _, first := range []syscall.Signal{syscall.SIGTERM, syscall.SIGUSR1} {
		t.Run(first.String(), func(t *testing.T) {
			r := newRelayed(t, true)
			r.send(first)
			r.send(syscall.SIGUSR1)
			r.send(syscall.SIGTERM)
			r.send(syscall.SIGINT) // relay has acted on the repeats
			if !closed(r.ctx.Done()) {
				t.Fatal("SIGINT after the repeats did not cancel ctx")
			}
			var ie *launch.InterruptedError
			if err := context.Cause(r.ctx); !errors.As(err, &ie) || ie.Signal != syscall.SIGINT {
				t.Fatalf("cause = %v, want SIGINT's interruption (a repeated preemption signal cancelled it)", err)
			}
			if !notClosed(r.abort) {
				t.Fatal("abort closed")
			}
		})
	}
}

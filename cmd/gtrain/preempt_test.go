package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/launch"
)

// relayed runs signals.relay over a channel the test feeds.
type relayed struct {
	sig    *signals
	sigc   chan os.Signal
	ctx    context.Context
	abort  chan struct{}
	cancel context.CancelCauseFunc
}

func newRelayed(t *testing.T, catch bool) *relayed {
	t.Helper()
	r := &relayed{sigc: make(chan os.Signal), abort: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancelCause(t.Context())
	r.sig = newSignals(r.abort)
	if catch {
		r.sig.catchPreemption()
	}
	go r.sig.relay(r.sigc, r.cancel, r.abort)
	t.Cleanup(func() { close(r.sigc); r.cancel(nil) })
	return r
}

// send hands s to relay (which has then acted on every signal before it).
func (r *relayed) send(s os.Signal) { r.sigc <- s }

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(10 * time.Second): // backstop: relay acts on the signal it was handed
		return false
	}
}

func notClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// TestSignalsPreemption: in a command that catches preemption (the
// worker), the first SIGTERM or SIGUSR1 closes preempt and leaves ctx alone
// (the checkpoint's collectives need it); a SIGINT cancels ctx, and one
// more aborts.
func TestSignalsPreemption(t *testing.T) {
	for _, first := range []syscall.Signal{syscall.SIGTERM, syscall.SIGUSR1} {
		t.Run(first.String(), func(t *testing.T) {
			r := newRelayed(t, true)
			r.send(first)
			if !closed(r.sig.preempt) {
				t.Fatal("preempt not closed by the first signal")
			}
			if r.ctx.Err() != nil {
				t.Fatal("ctx cancelled by the first preemption signal")
			}
			if got := r.sig.preemptSignal(); got != first {
				t.Errorf("preemptSignal = %v, want %v", got, first)
			}
			r.send(syscall.SIGINT)
			if !closed(r.ctx.Done()) {
				t.Fatal("SIGINT did not cancel ctx")
			}
			var ie *launch.InterruptedError
			if !errors.As(context.Cause(r.ctx), &ie) || ie.Signal != syscall.SIGINT {
				t.Errorf("cause = %v, want interrupted by SIGINT", context.Cause(r.ctx))
			}
			if !notClosed(r.abort) {
				t.Error("abort closed by the second signal")
			}
			r.send(syscall.SIGINT)
			if !closed(r.abort) {
				t.Error("third signal did not abort")
			}
		})
	}
}

// TestSignalsNoPreemption: commands that do not catch preemption (the
// launcher among them) are cancelled by the first signal of any kind, SIGINT
// in a worker too; the second aborts.
func TestSignalsNoPreemption(t *testing.T) {
	for _, tt := range []struct {
		catch bool
		sig   syscall.Signal
	}{{false, syscall.SIGTERM}, {false, syscall.SIGUSR1}, {false, syscall.SIGINT}, {true, syscall.SIGINT}} {
		t.Run(fmt.Sprintf("catch=%v/%v", tt.catch, tt.sig), func(t *testing.T) {
			r := newRelayed(t, tt.catch)
			r.send(tt.sig)
			if !closed(r.ctx.Done()) {
				t.Fatal("first signal did not cancel ctx")
			}
			var ie *launch.InterruptedError
			if !errors.As(context.Cause(r.ctx), &ie) || ie.Signal != tt.sig {
				t.Errorf("cause = %v, want interrupted by %v", context.Cause(r.ctx), tt.sig)
			}
			if !notClosed(r.sig.preempt) {
				t.Error("preempt closed")
			}
			r.send(tt.sig)
			if !closed(r.abort) {
				t.Error("second signal did not abort")
			}
		})
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
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
// (the checkpoint's collectives need it); the next signal cancels ctx, and
// one more aborts.
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
			r.send(syscall.SIGTERM)
			if !closed(r.ctx.Done()) {
				t.Fatal("second signal did not cancel ctx")
			}
			var ie *launch.InterruptedError
			if !errors.As(context.Cause(r.ctx), &ie) || ie.Signal != syscall.SIGTERM {
				t.Errorf("cause = %v, want interrupted by SIGTERM", context.Cause(r.ctx))
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

// TestWriteErrorFile: the worker's error file is torch's form, which the
// agent quotes, marked peer_failed exactly when the rank failed because a
// peer's link broke.
func TestWriteErrorFile(t *testing.T) {
	tests := []struct {
		name string
		err  error
		peer bool
	}{
		{"peer process gone", fmt.Errorf("train: step 3: %w", &comm.OpError{Rank: 0, Op: "all_reduce", Seq: 3,
			Err: &comm.LinkError{Transport: "shm", Op: "recv", Peer: 1, Err: comm.ErrPeerGone}}), true},
		{"peer closed", &comm.OpError{Rank: 1, Op: "all_reduce", Err: &comm.PeerError{Peer: 0, World: -1, Err: comm.ErrPeerClosed}}, true},
		{"own failure", errors.New("train: step 3: loss is NaN"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "error.json")
			writeErrorFile(path, tt.err)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var f struct {
				Message struct {
					Message string `json:"message"`
				} `json:"message"`
				PeerFailed bool `json:"peer_failed"`
			}
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if f.Message.Message != tt.err.Error() || f.PeerFailed != tt.peer {
				t.Errorf("error file %s, want message %q and peer_failed %v", b, tt.err, tt.peer)
			}
		})
	}
	writeErrorFile("", errors.New("no file asked for")) // must not fail
}

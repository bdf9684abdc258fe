// Package commtest runs the ranks of a test in one process: each rank's
// function in its own goroutine, their errors collected by rank, and the
// communicators they connect closed when the test ends. Tests connect
// their ranks over comm.NewInProc and comm.New (or a group of their own):
// this package imports nothing of engine/comm, so that package comm's own
// tests can use it too (an import of comm here would be an import cycle
// there). It is for tests only: internal/deps keeps it out of production
// code.
package commtest

import (
	"context"
	"io"
	"sync"
	"testing"
)

// Run calls f for ranks 0..n-1 at once, each in its own goroutine, and
// returns their errors by rank once every call has returned. If stop is
// not nil, it is called, once, as soon as a rank fails: tests pass the
// cancel func of the context their ranks use, because a failing rank's
// peers would otherwise wait for it in a collective until their
// communicator's timeout. Tests of what the peers of a failing rank see
// pass nil.
func Run(n int, stop func(), f func(r int) error) []error {
	errs := make([]error, n)
	var once sync.Once
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			if errs[r] = f(r); errs[r] != nil && stop != nil {
				once.Do(stop)
			}
		})
	}
	wg.Wait()
	return errs
}

// Check fails t with the error of the lowest failing rank, if any. Call
// it from the test's goroutine.
func Check(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d of %d: %v", r, len(errs), err)
			return // for a testing.TB whose Fatalf returns
		}
	}
}

// Must is Run followed by Check.
func Must(t testing.TB, n int, stop func(), f func(r int) error) {
	t.Helper()
	Check(t, Run(n, stop, f))
}

// Open connects n ranks at once, rank r by open(ctx, r) (a communicator's
// constructor blocks until its peers connect, so the ranks must open
// together), and closes them, in rank order, when the test ends. Each
// rank's context derives from ctx and is cancelled as soon as a rank fails
// to open, so that the others stop waiting for it; that failure fails the
// test.
func Open[C io.Closer](ctx context.Context, t testing.TB, n int, open func(ctx context.Context, r int) (C, error)) []C {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs := make([]C, n)
	ok := make([]bool, n)
	errs := Run(n, cancel, func(r int) (err error) {
		cs[r], err = open(ctx, r)
		ok[r] = err == nil
		return err
	})
	t.Cleanup(func() {
		for r, c := range cs {
			if ok[r] {
				c.Close()
			}
		}
	})
	Check(t, errs)
	return cs
}

// CloseAtEnd closes every element of cs, in order, when the test ends:
// the transports under communicators that Open closes (t.Cleanup runs
// the last registered first, so call it before Open).
func CloseAtEnd[C io.Closer](t testing.TB, cs []C) {
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
}

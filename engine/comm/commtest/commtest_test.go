package commtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunAtOnce: every rank runs at the same time (each waits until all
// have started, which deadlocks a runner that runs them one by one; the
// timeout is a backstop), errors come back by rank, and stop is called
// exactly once however many ranks fail, and never when none does.
func TestRunAtOnce(t *testing.T) {
	for _, failing := range [][]int{nil, {2}, {0, 1, 3}} {
		t.Run(fmt.Sprint(failing), func(t *testing.T) {
			const n = 4
			var started sync.WaitGroup
			started.Add(n)
			all := make(chan struct{})
			go func() { started.Wait(); close(all) }()
			var stops atomic.Int32
			errs := Run(n, func() { stops.Add(1) }, func(r int) error {
				started.Done()
				select {
				case <-all:
				case <-time.After(time.Minute):
					return errors.New("the other ranks did not start")
				}
				if slices.Contains(failing, r) {
					return fmt.Errorf("rank %d fails", r)
				}
				return nil
			})
			for r, err := range errs {
				if want := slices.Contains(failing, r); (err != nil) != want || want && err.Error() != fmt.Sprintf("rank %d fails", r) {
					t.Errorf("rank %d: %v, want failing %v", r, err, want)
				}
			}
			if want := min(len(failing), 1); int(stops.Load()) != want {
				t.Errorf("stop called %d times, want %d", stops.Load(), want)
			}
		})
	}
}

// fakeTB records Fatalf instead of ending the test.
type fakeTB struct {
	testing.TB
	fatal string
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }

// TestCheckNamesLowestRank: Check fails with the lowest failing rank's
// error, naming the rank and the size, and passes without errors.
func TestCheckNamesLowestRank(t *testing.T) {
	var f fakeTB
	Check(&f, []error{nil, nil, nil})
	if f.fatal != "" {
		t.Fatalf("no errors: %q", f.fatal)
	}
	Check(&f, []error{nil, errors.New("late"), errors.New("later")})
	if want := "rank 1 of 3: late"; f.fatal != want {
		t.Fatalf("Check: %q, want %q", f.fatal, want)
	}
}

// closer records the order of Close calls.
type closer struct {
	id  int
	log *[]int
}

func (c closer) Close() error { *c.log = append(*c.log, c.id); return nil }

// TestOpenClosesAtEnd: Open opens every rank at once (each open waits for
// all to start) and the communicators, then the transports registered
// before them with CloseAtEnd, are closed when the test ends, in rank
// order, and not before.
func TestOpenClosesAtEnd(t *testing.T) {
	var log []int
	t.Run("ranks", func(t *testing.T) {
		trs := []closer{{10, &log}, {11, &log}, {12, &log}}
		CloseAtEnd(t, trs)
		var started sync.WaitGroup
		started.Add(3)
		cs := Open(t.Context(), t, 3, func(_ context.Context, r int) (closer, error) {
			started.Done()
			started.Wait()
			return closer{r, &log}, nil
		})
		if len(cs) != 3 || cs[2].id != 2 || len(log) != 0 {
			t.Fatalf("Open: %v, closed already: %v", cs, log)
		}
	})
	if want := []int{0, 1, 2, 10, 11, 12}; !slices.Equal(log, want) {
		t.Fatalf("closed %v, want %v", log, want)
	}
}

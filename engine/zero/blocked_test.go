package zero

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/optim"
)

// TestWaitForSlowerRankIsBlockedTime: a rank whose gradient collectives
// wait for a slower rank counts that wait in comm.BlockedTime, at every
// stage. The launcher's straggler marking weighs a rank by its step time
// less that count: uncounted, the wait made the ranks that waited look
// slow and the slow one look fast (a real job with one rank stopped had
// the wrong rank marked). In a synctest bubble time moves only while every
// goroutine is blocked, so rank 0 waits exactly the delay of rank 1.
func TestWaitForSlowerRankIsBlockedTime(t *testing.T) {
	const delay = 300 * time.Millisecond
	for stage := range 4 {
		synctest.Test(t, func(t *testing.T) {
			trs := comm.NewInProc(2)
			errs := make(chan error, 2)
			before := comm.BlockedTime()
			for r := range 2 {
				go func() { errs <- reduceAfter(t, stage, r, trs[r], time.Duration(r)*delay) }()
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			// Both ranks share this process's count; only rank 0 waited.
			if got := comm.BlockedTime() - before; got != delay {
				t.Errorf("stage %d: blocked %v while rank 1 was %v late, want %v", stage, got, delay, delay)
			}
		})
	}
}

// reduceAfter is one rank of a step's gradient reduction at stage, its
// gradients ready after late.
func reduceAfter(t *testing.T, stage, r int, tr comm.Transport, late time.Duration) error {
	c, err := comm.New(t.Context(), r, 2, tr, comm.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	flat := make([]float32, testCfg.NumParams())
	cfg := Config{Stage: stage, Params: comm.Float32, Grads: comm.Float32, FirstBucket: 1 << 20, Bucket: 1 << 20,
		Optim: optim.Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}
	e, err := New(cfg, testCfg, c, flat)
	if err != nil {
		return err
	}
	e.Bind(t.Context())
	time.Sleep(late) // the slower rank's compute, in the bubble's time
	e.BeginMicro(0, 1)
	for u := len(testCfg.Units()) - 1; u >= 0; u-- {
		g := e.Grads(u)
		for i := range g {
			g[i] = float32(r + 1)
		}
		e.GradsDone(u)
	}
	e.drain()
	return e.err
}

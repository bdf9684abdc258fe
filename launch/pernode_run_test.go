package launch

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/rendezvous"
)

// storeWithRun is a store holding a run of nodes a and b whose first round
// is first (pernode/run unset when 0) and whose newest round, last, closed.
func storeWithRun(first, last int) *memStore {
	st := &memStore{data: map[string][]byte{}, lose: map[string]bool{}}
	if first > 0 {
		st.data[runKey] = []byte(strconv.Itoa(first))
	}
	for n := first; n <= last; n++ {
		st.data[roundKey(n, "count")] = []byte("2")
		st.data[roundKey(n, "closed")] = []byte("2")
		for i, name := range []string{"a", "b"} {
			raw, _ := json.Marshal(nodeInfo{Name: name})
			st.data[roundKey(n, "member/"+strconv.Itoa(i+1))] = raw
			st.data[roundKey(n, "beat/"+name)] = []byte("7")
		}
	}
	return st
}

func endRun(st *memStore, first int, ok bool) {
	raw, _ := json.Marshal(jobEnd{OK: ok, By: "a", Reason: "rank 0 exited with code 1"})
	st.data[roundKey(first, "end")] = raw
}

// TestPerNodeFindRun: where a node started with the job's --rdzv-id joins:
// the job's first round in an empty store; a live run's newest round
// (a member still beats); the round after a dead run (nothing moves for
// the silence limit) or a failed one, as a new run; and a job that ended
// well is over (*jobEndedError, OK).
func TestPerNodeFindRun(t *testing.T) {
	for _, tc := range []struct {
		name        string
		st          *memStore
		beats       bool // node b beats every second
		first, join int
		done        bool // the job ended well
	}{
		{name: "empty", st: storeWithRun(0, -1), first: 0, join: 0},
		{name: "live", st: storeWithRun(0, 2), beats: true, first: 0, join: 2},
		{name: "dead", st: storeWithRun(0, 2), first: 3, join: 3},
		{name: "dead second run", st: storeWithRun(3, 4), first: 5, join: 5},
		{name: "failed", st: func() *memStore { st := storeWithRun(3, 3); endRun(st, 3, false); return st }(), first: 4, join: 4},
		{name: "finished", st: func() *memStore { st := storeWithRun(0, 1); endRun(st, 0, true); return st }(), done: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pn := &perNode{store: tc.st, endpoint: "etcd-0:2379", etcd: &rendezvous.EtcdConfig{}, base: JobOptions{Heartbeat: time.Second}}
				ctx, cancel := context.WithCancel(t.Context())
				stopped := make(chan struct{})
				go func() { // node b's launcher
					defer close(stopped)
					for tc.beats {
						select {
						case <-ctx.Done():
							return
						case <-time.After(time.Second):
						}
						_, _ = tc.st.Add(ctx, roundKey(2, "beat/b"), 1)
					}
				}()
				join, err := pn.findRun(ctx)
				cancel()
				<-stopped
				var je *jobEndedError
				switch {
				case tc.done:
					if !errors.As(err, &je) || !je.end.OK {
						t.Fatalf("findRun = %d, %v; want the job's end, finished", join, err)
					}
				case err != nil:
					t.Fatal(err)
				case join != tc.join || pn.first != tc.first:
					t.Errorf("findRun joins round %d of the run from %d, want round %d of the run from %d", join, pn.first, tc.join, tc.first)
				}
				if got := string(tc.st.data[runKey]); !tc.done && tc.first > 0 && got != strconv.Itoa(tc.first) {
					t.Errorf("%s = %q, want %d", runKey, got, tc.first)
				}
			})
		})
	}
}

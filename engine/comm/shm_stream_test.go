//go:build linux

package comm

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// TestStreamOrder pins the order of in (I) and out (O) chunks on a link,
// which both of its ends compute.
func TestStreamOrder(t *testing.T) {
	for _, tc := range []struct {
		nIn, nOut int
		want      string
	}{
		{4, 4, "IIOIOIOO"},
		{1, 1, "IO"},
		{2, 2, "IIOO"},
		{3, 4, "IIOIOOO"}, // blocks of unequal length
		{4, 3, "IIOIOIO"},
		{0, 3, "OOO"}, // all-gather
		{3, 0, "III"}, // reduce-scatter
	} {
		var got strings.Builder
		in, out := 0, 0
		for in+out < tc.nIn+tc.nOut {
			if streamIn(in, out, tc.nIn, tc.nOut) {
				got.WriteByte('I')
				in++
			} else {
				got.WriteByte('O')
				out++
			}
		}
		if got.String() != tc.want {
			t.Errorf("%d in, %d out: order %s, want %s", tc.nIn, tc.nOut, got.String(), tc.want)
		}
	}
}

// TestStreamCopiesInBeforeLastReduce checks that a streamed all-reduce
// interleaves its phases: each rank copies in the peer's first finished
// chunk before it reduces its own third one. The link's order forces it
// (the peer's in chunk 2 comes after its out chunk 0), so no timing can
// make it pass; when out chunks queued behind all in chunks, every copy
// came after the last reduction.
func TestStreamCopiesInBeforeLastReduce(t *testing.T) {
	const chunk, chunks = 1024, 4 // chunks per block
	comms := shmWorld(t, sameHost(2), Options{Algorithm: "direct", ChunkBytes: chunk})
	var mu sync.Mutex
	events := map[int][]string{}
	streamHook = func(rank int, event string, j, c int) {
		mu.Lock()
		defer mu.Unlock()
		events[rank] = append(events[rank], event+string(rune('0'+j))+string(rune('0'+c)))
	}
	t.Cleanup(func() { streamHook = nil })
	n := 2 * chunks * chunk / 4
	bufs := make([][]float32, 2)
	commtest.Must(t, 2, nil, func(r int) error {
		bufs[r] = make([]float32, n)
		for i := range bufs[r] {
			bufs[r][i] = float32(i + r*n)
		}
		return comms[r].AllReduce(context.Background(), F32(bufs[r]), Sum)
	})
	for r := range 2 {
		for i, v := range bufs[r] {
			if want := float32(2*i + n); v != want {
				t.Fatalf("rank %d: element %d is %v, want %v", r, i, v, want)
			}
		}
		ev := events[r]
		copied := slices.Index(ev, "copy"+string(rune('0'+1-r))+"0")
		last := slices.Index(ev, "reduce"+string(rune('0'+r))+"2")
		if copied < 0 || last < 0 || len(ev) != 2*chunks {
			t.Fatalf("rank %d: events %v: want %d reductions and %d copies", r, ev, chunks, chunks)
		}
		if copied > last {
			t.Errorf("rank %d: events %v: the peer's chunk 0 was copied in after reducing chunk 2", r, ev)
		}
	}
}

// TestIdlerAloneNeverGosched checks that a progress loop's idle wait
// gives its CPU only to other processes: a Gosched wakes another thread of
// the rank, which on a busy host costs the peer its CPU. A plain wait
// (blocking Send and Recv) still lets the rank's other goroutines run.
func TestIdlerAloneNeverGosched(t *testing.T) {
	gosched0, yield0 := shmGosched, shmSchedYield
	t.Cleanup(func() { shmGosched, shmSchedYield = gosched0, yield0 })
	gosched, yields := 0, 0
	shmGosched = func() { gosched++ }
	shmSchedYield = func() { yields++ }
	// Each wait runs until shmYieldFor has passed; one preempted past the
	// whole yield phase makes no call, so wait until one did.
	until := func(alone bool, n *int) {
		for range 100 {
			idle := idler{alone: alone}
			for idle.wait() {
			}
			if *n > 0 {
				return
			}
		}
		t.Fatalf("alone=%v: no call in 100 waits of shmYieldFor", alone)
	}
	until(true, &yields)
	if gosched != 0 {
		t.Errorf("a progress loop's wait called Gosched %d times (and sched_yield %d), want never", gosched, yields)
	}
	until(false, &gosched)
}

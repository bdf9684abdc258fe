package comm

import (
	"bytes"
	"slices"
	"testing"
)

// TestTCPLimit: a write of the pass stops at tcpWriteMax, except that it
// takes up to tcpWriteSlack more where that ends the buffer it would cut
// or the queue, so that no write is a small tail of a chunk and its
// framing; what it returns is a prefix of the queue, which it leaves as
// it was.
func TestTCPLimit(t *testing.T) {
	const w, s = tcpWriteMax, tcpWriteSlack
	for _, tc := range []struct {
		name      string
		lens, cut []int
	}{
		{"empty", nil, nil},
		{"under the bound", []int{8, 32, 8, 1000}, []int{8, 32, 8, 1000}},
		{"header, length and a chunk: one write", []int{8, hdrSize, 8, w}, []int{8, hdrSize, 8, w}},
		{"the cut chunk's tail goes with it", []int{8, hdrSize, 8, w, 8, w}, []int{8, hdrSize, 8, w}},
		{"the queue's tail goes with it", []int{w / 2, w / 2, s - 1}, []int{w / 2, w / 2, s - 1}},
		{"a tail of the slack stays", []int{8, w + s}, []int{8, w - 8}},
		{"a queue of the slack over stays", []int{w / 2, w / 2, s + 1}, []int{w / 2, w / 2}},
		{"exactly the bound", []int{8, w - 8, 8, w}, []int{8, w - 8}},
		{"cut far from the end", []int{w - 100, 50, 8, w}, []int{w - 100, 50, 8, 42}},
		{"one long buffer", []int{2 * w}, []int{w}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bufs [][]byte
			var all []byte
			for i, n := range tc.lens {
				b := bytes.Repeat([]byte{byte(i + 1)}, n)
				bufs, all = append(bufs, b), append(all, b...)
			}
			before := slices.Clone(bufs)
			// Without storage of its own, and in storage kept from an
			// earlier cut (which must not be the queue's).
			into := make([][]byte, 1, 8)
			for _, storage := range []*[][]byte{nil, &into} {
				got := tcpLimit(bufs, w, storage)
				checkTCPCut(t, got, bufs, before, all, tc.cut)
			}
		})
	}
}

// checkTCPCut checks a cut of tcpLimit: cut lengths, the queue's first bytes,
// the queue unchanged.
func checkTCPCut(t *testing.T, got, bufs, before [][]byte, all []byte, cut []int) {
	t.Helper()
	var lens []int
	var flat []byte
	for _, b := range got {
		lens, flat = append(lens, len(b)), append(flat, b...)
	}
	if !slices.Equal(lens, cut) {
		t.Errorf("lengths %v, want %v", lens, cut)
	}
	if !bytes.Equal(flat, all[:len(flat)]) {
		t.Errorf("the %d bytes are not the queue's first", len(flat))
	}
	for i := range bufs {
		if len(bufs[i]) != len(before[i]) || (len(bufs[i]) > 0 && &bufs[i][0] != &before[i][0]) {
			t.Fatalf("the queue's buffer %d changed", i)
		}
	}
}

// tcpCallAllocs bounds what one rank's collective over TCP allocates in
// steady state: the operation's timeout (its context and timer), its
// state and closures; the pass and its lists are the communicator's.
// Before they were, a rank's call of 2 MiB among 2 allocated 33-37.
const tcpCallAllocs = 12

// TestTCPPassAllocs: the collectives over TCP allocate no more than
// tcpCallAllocs per call once warm, at a size of several chunks and
// writes, so that a training loop's collectives give the garbage
// collector little to do (on a rank pinned to a core a collection
// stalled calls by 0.4-1.4 ms, docs/benchmarks.md).
func TestTCPPassAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's bookkeeping allocates")
	}
	comms := tcpWorld(t, 2, 1, Options{})
	for _, kind := range []opKind{kAllReduce, kReduceScatter, kAllGather} {
		t.Run(kind.String(), func(t *testing.T) {
			run := tcpBenchOp(kind, 2<<20, comms)
			const calls = 20
			peer := make(chan error, 1)
			go func() { // AllocsPerRun calls once more to warm up
				for range calls + 1 {
					if err := run(1); err != nil {
						peer <- err
						return
					}
				}
				peer <- nil
			}()
			var err error
			allocs := testing.AllocsPerRun(calls, func() {
				if err == nil {
					err = run(0)
				}
			})
			if perr := <-peer; err != nil || perr != nil {
				t.Fatalf("rank 0: %v; rank 1: %v", err, perr)
			}
			// Both ranks' allocations are counted: they share the process.
			if allocs > 2*tcpCallAllocs {
				t.Errorf("%.1f allocations per call of both ranks, want at most %d", allocs, 2*tcpCallAllocs)
			}
		})
	}
}

package comm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// splitAll splits every communicator with color(r), key(r) and returns the
// new communicators by old rank (nil where color < 0).
func splitAll(t *testing.T, comms []*Communicator, color, key func(r int) int) []*Communicator {
	t.Helper()
	subs := make([]*Communicator, len(comms))
	commtest.Must(t, len(comms), nil, func(r int) error {
		var err error
		subs[r], err = comms[r].Split(t.Context(), color(r), key(r))
		return err
	})
	t.Cleanup(func() {
		for _, s := range subs {
			if s != nil {
				s.Close()
			}
		}
	})
	return subs
}

// groups returns the members of each color's group, ordered by new rank.
func groups(subs []*Communicator) map[string][]*Communicator {
	g := map[string][]*Communicator{}
	for _, s := range subs {
		if s != nil {
			g[s.Name()] = append(g[s.Name()], s)
		}
	}
	for _, m := range g {
		slices.SortFunc(m, func(a, b *Communicator) int { return a.Rank() - b.Rank() })
	}
	return g
}

func TestSplitMembership(t *testing.T) {
	for _, tc := range []struct {
		name       string
		p          int
		color, key func(r int) int
		want       map[string][]int // name → world ranks in new-rank order
	}{
		{"parity", 8, func(r int) int { return r % 2 }, func(r int) int { return r },
			map[string][]int{"world/0": {0, 2, 4, 6}, "world/1": {1, 3, 5, 7}}},
		{"reversed keys", 5, func(int) int { return 7 }, func(r int) int { return -r },
			map[string][]int{"world/7": {4, 3, 2, 1, 0}}},
		{"equal keys keep rank order", 4, func(r int) int { return r / 2 }, func(int) int { return 0 },
			map[string][]int{"world/0": {0, 1}, "world/1": {2, 3}}},
		{"undefined color", 5, func(r int) int { return map[bool]int{true: -1, false: 3}[r%2 == 1] },
			func(r int) int { return r }, map[string][]int{"world/3": {0, 2, 4}}},
		{"singletons", 3, func(r int) int { return r }, func(int) int { return 0 },
			map[string][]int{"world/0": {0}, "world/1": {1}, "world/2": {2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			subs := splitAll(t, newWorld(t, tc.p, Options{}), tc.color, tc.key)
			got := map[string][]int{}
			for name, members := range groups(subs) {
				for i, s := range members {
					if s.Size() != len(members) || s.Rank() != i {
						t.Errorf("%s: rank %d of %d at position %d", name, s.Rank(), s.Size(), i)
					}
					got[name] = append(got[name], s.WorldRank(s.Rank()))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("groups %v, want %v", got, tc.want)
			}
			for r, s := range subs {
				if (s == nil) != (tc.color(r) < 0) {
					t.Errorf("rank %d (color %d): sub-communicator %v", r, tc.color(r), s)
				}
			}
		})
	}
}

// TestSplitCollectives runs the whole matrix on the two halves of an
// 8-rank world split by parity, both at once.
func TestSplitCollectives(t *testing.T) {
	world := newWorld(t, 8, Options{ChunkBytes: 1024, RingThreshold: 4096})
	subs := splitAll(t, world, func(r int) int { return r % 2 }, func(r int) int { return r })
	for name, g := range groups(subs) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runMatrix(t, g)
		})
	}
}

// TestSplitTPDP builds the tensor- and data-parallel groups of a 2×4
// layout (TP varies fastest) and overlaps a DP all-reduce with TP
// collectives, as training does.
func TestSplitTPDP(t *testing.T) {
	const p, tpSize, n = 8, 4, 1001
	world := newWorld(t, p, Options{Name: "job", ChunkBytes: 512, RingThreshold: 2048})
	tp := splitAll(t, world, func(r int) int { return r / tpSize }, func(r int) int { return r % tpSize })
	dp := splitAll(t, world, func(r int) int { return r % tpSize }, func(r int) int { return r / tpSize })
	grads, tpBufs := make([]Buffer, p), make([]Buffer, p)
	gradIns, tpIns := make([][]float64, p), make([][]float64, p)
	for r := range p {
		grads[r], gradIns[r] = makeInput(BFloat16, n, 1, r)
		tpBufs[r], tpIns[r] = makeInput(Float32, n, 2, r)
	}
	commtest.Must(t, p, nil, func(r int) error {
		h := dp[r].AllReduceAsync(t.Context(), grads[r], Avg)
		if err := tp[r].AllReduce(t.Context(), tpBufs[r], Sum); err != nil {
			return err
		}
		if err := tp[r].Barrier(t.Context()); err != nil {
			return err
		}
		return h.Wait(t.Context())
	})
	for r := range p {
		if tp[r].Name() != fmt.Sprintf("job/%d", r/tpSize) || dp[r].Size() != 2 || tp[r].Rank() != r%tpSize {
			t.Fatalf("rank %d: tp %s rank %d, dp size %d", r, tp[r].Name(), tp[r].Rank(), dp[r].Size())
		}
		dpPeers := [][]float64{gradIns[r%tpSize], gradIns[r%tpSize+tpSize]}
		ref, tol := refReduce(BFloat16, Avg, dpPeers, 0, n)
		checkNear(t, fmt.Sprintf("rank %d dp", r), grads[r], ref, tol)
		base := r / tpSize * tpSize
		ref, tol = refReduce(Float32, Sum, tpIns[base:base+tpSize], 0, n)
		checkNear(t, fmt.Sprintf("rank %d tp", r), tpBufs[r], ref, tol)
	}
}

func TestSplitNested(t *testing.T) {
	world := newWorld(t, 8, Options{Hosts: testHosts(8)})
	halves := splitAll(t, world, func(r int) int { return r / 4 }, func(r int) int { return r })
	quarters := splitAll(t, halves, func(r int) int { return halves[r].Rank() / 2 }, func(r int) int { return -r })
	for r, q := range quarters {
		wantPeer := r ^ 1
		if q.Size() != 2 || q.WorldRank(1-q.Rank()) != wantPeer {
			t.Fatalf("rank %d: quarter of size %d, peer world rank %d", r, q.Size(), q.WorldRank(1-q.Rank()))
		}
	}
	bufs := make([]Buffer, 8)
	for r := range bufs {
		bufs[r] = F32([]float32{float32(r)})
	}
	commtest.Must(t, 8, nil, func(r int) error { return quarters[r].AllReduce(t.Context(), bufs[r], Sum) })
	for r, b := range bufs {
		if got, want := b.Float32s()[0], float32(r+(r^1)); got != want {
			t.Errorf("rank %d: %v, want %v", r, got, want)
		}
	}
	// Errors in a sub-group name the peer's world rank and host.
	errs := commtest.Run(8, nil, func(r int) error {
		if r == 5 {
			return quarters[r].Close()
		}
		return quarters[r].Barrier(t.Context())
	})
	if want := "peer rank 0 (world rank 5, host h5)"; errs[4] == nil || !strings.Contains(errs[4].Error(), want) {
		t.Errorf("rank 4: %v, want %q", errs[4], want)
	}
}

// plainTransport hides InProc's ConnectGroup.
type plainTransport struct{ Transport }

func TestSplitNeedsGroupTransport(t *testing.T) {
	trs := NewInProc(2)
	comms := make([]*Communicator, 2)
	commtest.Must(t, 2, nil, func(r int) error {
		var err error
		comms[r], err = New(t.Context(), r, 2, plainTransport{trs[r]}, Options{})
		return err
	})
	errs := commtest.Run(2, nil, func(r int) error {
		_, err := comms[r].Split(t.Context(), 0, r)
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "does not implement GroupTransport") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// The world is still usable: the exchange completed everywhere.
	commtest.Must(t, 2, nil, func(r int) error { return comms[r].Barrier(context.Background()) })
}

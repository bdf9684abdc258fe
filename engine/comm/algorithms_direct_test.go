//go:build linux

package comm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// shmWorld connects p goroutine ranks through Connect with the given host
// ids (all "" = one host: shared memory; otherwise TCP between hosts).
func shmWorld(t *testing.T, hosts []string, opts Options) []*Communicator {
	t.Helper()
	p := len(hosts)
	store := NewMemStore()
	dir := t.TempDir()
	comms := make([]*Communicator, p)
	trs := make([]Transport, p)
	commtest.Must(t, p, nil, func(r int) error {
		var err error
		trs[r], err = Connect(t.Context(), BootstrapConfig{
			Rank: r, Size: p, Store: store, Secret: tpSecret, Prefix: "job/0", HostID: hosts[r],
			TCP: TCPConfig{Bind: "127.0.0.1:0", Advertise: "127.0.0.1", DialTimeout: 5 * time.Second},
			SHM: SHMConfig{Dir: dir, RingBytes: 64 << 10},
		})
		if err != nil {
			return err
		}
		comms[r], err = New(context.Background(), r, p, trs[r], opts)
		return err
	})
	t.Cleanup(func() {
		for r := range p {
			comms[r].Close()
			trs[r].Close()
		}
	})
	return comms
}

func sameHost(p int) []string { return make([]string, p) }

// TestDirectOverSHM runs the correctness matrix with the direct
// (streaming) algorithms over real shared-memory links, with a ring small
// enough that messages wrap around it; across two "hosts" direct falls
// back to the ring.
func TestDirectOverSHM(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []string
	}{
		{"p2", sameHost(2)},
		{"p3", sameHost(3)},
		{"p5", sameHost(5)},
		{"two-hosts/p4", []string{"a", "a", "b", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := shmWorld(t, tc.hosts, Options{Algorithm: "direct", ChunkBytes: 1024, Timeout: 20 * time.Second})
			runMatrix(t, comms)
		})
	}
}

// TestAutoPicksDirectOnOneHost: on one host, auto streams all-reduce,
// reduce-scatter and all-gather from 64 KiB; across hosts it uses the ring
// (all-reduce: hierarchical where the shape allows, see TestHierarchical).
func TestAutoPicksDirectOnOneHost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []string
		kind  opKind
		bytes int
		want  algorithm
	}{
		{"all_reduce 1 KiB", sameHost(2), kAllReduce, 1 << 10, algRD},
		{"all_reduce 1 MiB", sameHost(2), kAllReduce, 1 << 20, algDirect},
		{"all_reduce 64 MiB", sameHost(3), kAllReduce, 64 << 20, algDirect},
		{"reduce_scatter 1 MiB", sameHost(2), kReduceScatter, 1 << 20, algDirect},
		{"all_gather 64 MiB", sameHost(2), kAllGather, 64 << 20, algDirect},
		{"broadcast 1 MiB", sameHost(2), kBroadcast, 1 << 20, algRing},
		{"all_reduce 1 MiB, two hosts", []string{"a", "a", "b"}, kAllReduce, 1 << 20, algRing},
	} {
		for r, c := range shmWorld(t, tc.hosts, Options{}) {
			if got := c.pick(tc.kind, tc.bytes); got != tc.want {
				t.Errorf("%s: rank %d picks %v, want %v", tc.name, r, got, tc.want)
			}
		}
	}
	forced := shmWorld(t, []string{"a", "b"}, Options{Algorithm: "direct"})
	if got := forced[0].pick(kAllReduce, 1<<20); got != algRing {
		t.Errorf("direct forced across hosts: %v, want ring", got)
	}
}

// TestDirectPeerDeath: a rank that stops answering in the middle of a
// direct all-reduce is reported by rank, within the timeout.
func TestDirectPeerDeath(t *testing.T) {
	comms := shmWorld(t, sameHost(3), Options{Timeout: 2 * time.Second})
	errs := commtest.Run(2, nil, func(r int) error {
		return comms[r].AllReduce(t.Context(), NewBuffer(Float32, 1<<18), Sum)
	})
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: all-reduce without rank 2 succeeded", r)
		}
		t.Logf("rank %d: %v", r, err)
		if want := "rank 2"; !strings.Contains(err.Error(), want) {
			t.Errorf("rank %d: %v, want it to name %s", r, err, want)
		}
	}
}

// TestHierarchical runs the correctness matrix on groups that span two or
// three "hosts" (shared memory within, TCP between), equal and unequal,
// with a threshold low enough that every all-reduce, reduce-scatter and
// all-gather of 64 bytes or more is hierarchical, and checks which groups
// got the two levels, and their shape.
func TestHierarchical(t *testing.T) {
	cases := []struct {
		name  string
		hosts []string
		hier  bool
		m     int // channels: the fewest ranks on a host
	}{
		{"2x2", []string{"a", "a", "b", "b"}, true, 2},
		{"3x2", []string{"a", "b", "c", "a", "b", "c"}, true, 2}, // hosts interleaved in rank order
		{"2x3", []string{"a", "a", "a", "b", "b", "b"}, true, 3},
		{"2+1", []string{"a", "a", "b"}, true, 1},
		{"2+1+3", []string{"a", "a", "b", "c", "c", "c"}, true, 1},
		{"3+2 interleaved", []string{"a", "b", "a", "b", "a"}, true, 2},
		{"2+4 out of order", []string{"b", "a", "b", "a", "b", "b"}, true, 2},
		{"one-per-host", []string{"a", "b", "c"}, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := shmWorld(t, tc.hosts, Options{RingThreshold: 64, ChunkBytes: 1024, Timeout: 20 * time.Second})
			runMatrix(t, comms)
			for r, c := range comms {
				if got := c.hier != nil && c.hier.local != nil; got != tc.hier {
					t.Fatalf("rank %d: hierarchical %v, want %v", r, got, tc.hier)
				}
				if tc.hier {
					checkLevels(t, c, tc.hosts, tc.m)
				}
			}
		})
	}
}

// checkLevels checks the levels of c: the local one holds exactly the
// ranks of c's host, the channel one (for the first m ranks of a host) one
// rank of each host. hosts names the host of each world rank.
func checkLevels(t *testing.T, c *Communicator, hosts []string, m int) {
	t.Helper()
	h, r := c.hier, c.WorldRank(c.Rank())
	if h.m != m {
		t.Errorf("rank %d: %d channels, want %d", r, h.m, m)
	}
	var mine []int // world ranks of the group on c's host
	nhosts := map[string]bool{}
	for g := range c.Size() {
		w := c.WorldRank(g)
		nhosts[hosts[w]] = true
		if hosts[w] == hosts[r] {
			mine = append(mine, w)
		}
	}
	if h.local.Size() != len(mine) {
		t.Fatalf("rank %d: local level of %d ranks, want %d", r, h.local.Size(), len(mine))
	}
	for i, w := range mine {
		if got := h.local.WorldRank(i); got != w {
			t.Errorf("rank %d: local rank %d is rank %d, want %d", r, i, got, w)
		}
	}
	if (h.cross != nil) != (h.local.Rank() < m) {
		t.Fatalf("rank %d (local %d): channel level %v, want one only for local ranks below %d", r, h.local.Rank(), h.cross != nil, m)
	}
	if h.cross == nil {
		return
	}
	if h.cross.Size() != len(nhosts) {
		t.Errorf("rank %d: channel level of %d ranks, want one per host (%d)", r, h.cross.Size(), len(nhosts))
	}
	seen := map[string]bool{}
	for i := range h.cross.Size() {
		seen[hosts[h.cross.WorldRank(i)]] = true
	}
	if len(seen) != h.cross.Size() {
		t.Errorf("rank %d: channel level spans hosts %v, want each host once", r, seen)
	}
}

// TestHierarchicalSubGroup: a group Split off a world that spans hosts
// (ZeRO's data-parallel group, say) takes the hierarchical path when its
// own ranks span hosts with several on one, here 2 and 1 of the 3 ranks
// each of 2 hosts.
func TestHierarchicalSubGroup(t *testing.T) {
	hosts := []string{"a", "a", "a", "b", "b", "b"}
	world := shmWorld(t, hosts, Options{RingThreshold: 64, ChunkBytes: 1024, Timeout: 20 * time.Second})
	subs := make([]*Communicator, len(world))
	commtest.Must(t, len(world), nil, func(r int) error {
		var err error
		subs[r], err = world[r].Split(t.Context(), min(r%3, 1), r) // {0, 3} and {1, 2, 4, 5}
		return err
	})
	t.Cleanup(func() {
		for _, c := range subs {
			c.Close()
		}
	})
	group := []*Communicator{subs[1], subs[2], subs[4], subs[5]}
	for _, mc := range matrixCases[:3] { // all-reduce, reduce-scatter, all-gather
		mc.run(t, group, caseArgs{dt: Float32, n: 4099, op: Avg, salt: 7})
	}
	for _, c := range group {
		if c.hier == nil || c.hier.local == nil {
			t.Fatalf("%s rank %d: not hierarchical", c.Name(), c.Rank())
		}
		checkLevels(t, c, hosts, 2)
	}
}

// TestHierarchicalLayout checks the packed order of reduce-scatter and
// all-gather: every rank's block placed once, without overlap, each
// channel contiguous and each host's part of it too.
func TestHierarchicalLayout(t *testing.T) {
	hosts := [][]int{{0, 3, 5}, {1, 2}, {4, 6, 7, 8}} // 3, 2 and 4 ranks: 2 channels
	for _, n := range []int{0, 5, 9, 1000, 1001} {
		w := partition{n, 9}
		for k, rs := range hosts {
			for i := range rs {
				h := &hierarchy{hosts: hosts, host: k, index: i, m: 2}
				l := h.layout(w)
				covered := make([]int, n)
				for r, at := range l.at {
					for e := at; e < at+w.count(r); e++ {
						covered[e]++
					}
				}
				for e, c := range covered {
					if c != 1 {
						t.Fatalf("n %d: element %d of the packed buffer is in %d blocks", n, e, c)
					}
				}
				if l.local.offset(len(rs)) != n || l.local.count(len(rs)-1) != 0 && len(rs) > 2 {
					t.Errorf("n %d host %d: channels %v do not end the buffer with empty blocks", n, k, l.local)
				}
				// This rank's channel, host by host, in the packed order.
				c := i % 2
				seg := l.local.offset(c)
				for kk, rr := range hosts {
					if len(rr) > c && l.at[rr[c]] != seg+l.cross.offset(kk) {
						t.Errorf("n %d: channel %d of host %d starts at %d, want %d", n, c, kk, l.at[rr[c]], seg+l.cross.offset(kk))
					}
				}
			}
		}
	}
}

// TestHierarchicalMismatch: a rank that all-reduces another count is
// reported, not waited for.
func TestHierarchicalMismatch(t *testing.T) {
	comms := shmWorld(t, []string{"a", "a", "b", "b"}, Options{RingThreshold: 64, Timeout: 5 * time.Second})
	commtest.Must(t, 4, nil, func(r int) error { return comms[r].AllReduce(t.Context(), NewBuffer(Float32, 1000), Sum) })
	errs := commtest.Run(4, nil, func(r int) error {
		n := 1000
		if r == 3 {
			n = 1024
		}
		return comms[r].AllReduce(t.Context(), NewBuffer(Float32, n), Sum)
	})
	var mismatch bool
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: mismatched all-reduce succeeded", r)
			continue
		}
		var me *MismatchError
		mismatch = mismatch || errors.As(err, &me)
	}
	if !mismatch {
		t.Errorf("no rank reported a mismatch: %v", errs)
	}
}

// TestStreamingPeerCloses: a rank whose communicator closes in the middle
// of a streaming all-reduce makes its peers fail at once, naming it.
func TestStreamingPeerCloses(t *testing.T) {
	comms := shmWorld(t, sameHost(3), Options{Timeout: 20 * time.Second})
	start := time.Now()
	errs := commtest.Run(3, nil, func(r int) error {
		if r == 2 {
			time.AfterFunc(20*time.Millisecond, func() { comms[2].Close() })
		}
		buf := NewBuffer(Float32, 64<<20)
		for range 100 { // long enough that the close lands mid-operation
			if err := comms[r].AllReduce(t.Context(), buf, Sum); err != nil {
				return err
			}
		}
		return nil
	})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the failure took %v to surface", d)
	}
	// The first to notice names rank 2; the other may name the first, which
	// closed its links when it failed.
	named := false
	for r := range 2 {
		if errs[r] == nil {
			t.Fatalf("rank %d: no error", r)
		}
		named = named || strings.Contains(errs[r].Error(), "rank 2")
	}
	if !named {
		t.Errorf("no rank named rank 2: %v", errs[:2])
	}
	if !errors.Is(errs[2], ErrClosed) {
		t.Errorf("rank 2: %v, want ErrClosed", errs[2])
	}
}

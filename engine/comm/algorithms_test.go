package comm

import (
	"fmt"
	"testing"
)

func TestPick(t *testing.T) {
	for _, tc := range []struct {
		alg    string
		kind   opKind
		nbytes int
		want   algorithm
	}{
		{"auto", kAllReduce, 64<<10 - 1, algRD},
		{"auto", kAllReduce, 64 << 10, algRing},
		{"auto", kReduceScatter, 1 << 20, algRing},
		{"auto", kAllGather, 100, algRD},
		{"auto", kBroadcast, 100, algTree},
		{"auto", kBroadcast, 1 << 20, algRing},
		{"auto", kReduce, 100, algTree},
		{"auto", kGather, 1 << 30, algDirect},
		{"auto", kBarrier, 0, algRD},
		{"ring", kAllReduce, 4, algRing},
		{"rd", kAllReduce, 1 << 30, algRD},
		{"rd", kBroadcast, 4, algTree},
		{"tree", kAllReduce, 1 << 30, algTree},
		{"tree", kScatter, 4, algDirect},
	} {
		t.Run(fmt.Sprintf("%s/%v/%d", tc.alg, tc.kind, tc.nbytes), func(t *testing.T) {
			c := newWorld(t, 1, Options{Algorithm: tc.alg})[0]
			if got := c.pick(tc.kind, tc.nbytes); got != tc.want {
				t.Errorf("pick = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestAutoAcrossThreshold runs all-reduce and reduce-scatter with the
// default options on both sides of the 64 KiB threshold.
func TestAutoAcrossThreshold(t *testing.T) {
	for _, p := range []int{3, 4} {
		comms := newWorld(t, p, Options{})
		for _, n := range []int{16383, 16384, 70001} {
			t.Run(fmt.Sprintf("p%d/n%d", p, n), func(t *testing.T) {
				testAllReduce(t, comms, caseArgs{dt: Float32, n: n, op: Sum, salt: n})
				testReduceScatter(t, comms, caseArgs{dt: BFloat16, n: n, op: Avg, salt: n, inPlace: true})
				testAllGather(t, comms, caseArgs{dt: Float16, n: n, salt: n})
				testBroadcast(t, comms, caseArgs{dt: Float32, n: n, salt: n})
			})
		}
	}
}

func TestPartition(t *testing.T) {
	for _, tc := range []struct{ n, p int }{{0, 3}, {1, 8}, {7, 3}, {4099, 8}, {13, 13}, {12, 5}} {
		q := partition{tc.n, tc.p}
		off := 0
		for i := range tc.p {
			if q.offset(i) != off {
				t.Fatalf("%v: block %d at %d, want %d", q, i, q.offset(i), off)
			}
			if c := q.count(i); c != tc.n/tc.p && c != tc.n/tc.p+1 || (c > tc.n/tc.p) != (i < tc.n%tc.p) {
				t.Fatalf("%v: block %d has %d elements", q, i, c)
			}
			off += q.count(i)
		}
		if off != tc.n {
			t.Fatalf("%v: blocks cover %d elements", q, off)
		}
	}
}

// TestHeaderRoundTrip checks the header codec and that a garbled header is
// refused.
func TestHeaderRoundTrip(t *testing.T) {
	h := header{kind: kReduceScatter, dt: BFloat16, op: Avg, alg: algRing, root: -1, chunk: 1 << 18, seq: 1<<40 + 3, count: 1<<33 + 7}
	var b [hdrSize]byte
	h.encode(&b)
	got, ok := decodeHeader(&b)
	if !ok || got != h {
		t.Fatalf("decoded %+v, %v", got, ok)
	}
	if d := h.mismatch(got); d != "" {
		t.Fatalf("identical headers differ: %s", d)
	}
	got.seq++
	if d := h.mismatch(got); d != fmt.Sprintf("called reduce_scatter #%d", h.seq+1) {
		t.Fatalf("sequence mismatch: %q", d)
	}
	b[0] ^= 1
	if _, ok := decodeHeader(&b); ok {
		t.Fatal("a header with a bad magic was accepted")
	}
}

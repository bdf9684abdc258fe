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
			got := tcpLimit(bufs, w)
			var lens []int
			var flat []byte
			for _, b := range got {
				lens, flat = append(lens, len(b)), append(flat, b...)
			}
			if !slices.Equal(lens, tc.cut) {
				t.Errorf("lengths %v, want %v", lens, tc.cut)
			}
			if !bytes.Equal(flat, all[:len(flat)]) {
				t.Errorf("the %d bytes are not the queue's first", len(flat))
			}
			for i := range bufs {
				if len(bufs[i]) != len(before[i]) || (len(bufs[i]) > 0 && &bufs[i][0] != &before[i][0]) {
					t.Fatalf("the queue's buffer %d changed", i)
				}
			}
		})
	}
}

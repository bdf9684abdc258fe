package comm

import (
	"context"
	"fmt"
	"testing"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// BenchmarkAllReduce runs an f32 sum all-reduce on p goroutine ranks over
// InProc: the collective layer's own cost (framing, scheduling, the
// reduction kernel), with a transport that only copies. MB/s is algbw (the
// buffer size over the time); busbw, as nccl-tests defines it, is
// algbw·2(p-1)/p.
func BenchmarkAllReduce(b *testing.B) {
	for _, p := range []int{2, 4} {
		for _, size := range []int{4 << 10, 64 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("p%d/%s", p, sizeName(size)), func(b *testing.B) {
				benchAllReduce(b, newWorld(b, p, Options{}), size)
			})
		}
	}
}

// benchAllReduce runs b.N all-reduces of size bytes on every rank of comms.
func benchAllReduce(b *testing.B, comms []*Communicator, size int) {
	p := len(comms)
	bufs := make([]Buffer, p)
	for r := range bufs {
		bufs[r] = NewBuffer(Float32, size/4)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	errs := commtest.Run(p, nil, func(r int) error {
		for range b.N {
			if err := comms[r].AllReduce(context.Background(), bufs[r], Sum); err != nil {
				return err
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
}

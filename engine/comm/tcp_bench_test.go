package comm

import (
	"context"
	"fmt"
	"testing"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// tcpWorld connects p communicators with opts over loopback TCP with
// conns connections per peer, and closes them when the test ends.
func tcpWorld(b testing.TB, p, conns int, opts Options) []*Communicator {
	b.Helper()
	store := NewMemStore()
	trs := make([]Transport, p)
	commtest.Must(b, p, nil, func(r int) error {
		tr, err := NewTCP(context.Background(), TCPConfig{Rank: r, Size: p, Store: store, Secret: tpSecret,
			Prefix: "job/0/tcp", Bind: "127.0.0.1:0", Advertise: "127.0.0.1", ConnsPerPeer: conns})
		trs[r] = tr
		return err
	})
	commtest.CloseAtEnd(b, trs)
	return commtest.Open(context.Background(), b, p, func(ctx context.Context, r int) (*Communicator, error) {
		return New(ctx, r, p, trs[r], opts)
	})
}

// BenchmarkTCPExchange is one message each way between two ranks over a
// loopback TCP link, both directions at once (a ring step of two ranks):
// the per-message cost of the TCP path.
func BenchmarkTCPExchange(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			_, links := tpMesh(b, 2, tpTCP(NewMemStore(), 1, tpSameSecret))
			bufs := [2][2][]byte{{make([]byte, size), make([]byte, size)}, {make([]byte, size), make([]byte, size)}}
			b.SetBytes(int64(size))
			b.ResetTimer()
			commtest.Must(b, 2, nil, func(r int) error {
				c := links[r][1-r]
				for range b.N {
					err := par(context.Background(),
						func(ctx context.Context) error { return c.Send(ctx, bufs[r][0]) },
						func(ctx context.Context) error { return c.Recv(ctx, bufs[r][1]) })
					if err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

// BenchmarkTCPCollectives runs the f32 sum collectives on two ranks over
// loopback TCP: all-gather and reduce-scatter are one ring step (64 KiB:
// one message each way), all-reduce two.
func BenchmarkTCPCollectives(b *testing.B) {
	for _, kind := range []opKind{kAllReduce, kReduceScatter, kAllGather} {
		for _, size := range []int{64 << 10, 1 << 20, 8 << 20} {
			b.Run(fmt.Sprintf("%v/%s", kind, sizeName(size)), func(b *testing.B) {
				comms := tcpWorld(b, 2, 1, Options{})
				run := tcpBenchOp(kind, size, comms)
				b.SetBytes(int64(size))
				b.ResetTimer()
				commtest.Must(b, 2, nil, func(r int) error {
					for range b.N {
						if err := run(r); err != nil {
							return err
						}
					}
					return nil
				})
			})
		}
	}
}

// tcpBenchOp returns one call of kind on a size-byte f32 buffer by rank r
// of comms, each rank with buffers of its own.
func tcpBenchOp(kind opKind, size int, comms []*Communicator) func(r int) error {
	p := len(comms)
	bufs := make([][2]Buffer, p)
	for r := range bufs {
		bufs[r] = [2]Buffer{NewBuffer(Float32, size/4), NewBuffer(Float32, size/4/p)}
	}
	ctx := context.Background()
	return func(r int) error {
		c, bb := comms[r], bufs[r]
		switch kind {
		case kReduceScatter:
			return c.ReduceScatter(ctx, bb[0], bb[1], Sum)
		case kAllGather:
			return c.AllGather(ctx, bb[1], bb[0])
		}
		return c.AllReduce(ctx, bb[0], Sum)
	}
}

// BenchmarkTCPAllReduceAlg is the 2-rank f32 sum all-reduce over loopback
// TCP with the ring and with recursive doubling (one exchange of the whole
// buffer), interleaved size by size, for choosing between them.
func BenchmarkTCPAllReduceAlg(b *testing.B) {
	for _, size := range []int{64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20} {
		for _, alg := range []string{"ring", "rd"} {
			b.Run(fmt.Sprintf("%s/%s", sizeName(size), alg), func(b *testing.B) {
				comms := tcpWorld(b, 2, 1, Options{Algorithm: alg})
				run := tcpBenchOp(kAllReduce, size, comms)
				b.SetBytes(int64(size))
				b.ResetTimer()
				commtest.Must(b, 2, nil, func(r int) error {
					for range b.N {
						if err := run(r); err != nil {
							return err
						}
					}
					return nil
				})
			})
		}
	}
}

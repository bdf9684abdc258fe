//go:build linux

package comm

import (
	"context"
	"strconv"
	"testing"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// Benchmarks between two goroutines of one process acting as two ranks
// (TCP over loopback, for comparison); cross-process figures come from
// `gtrain bench`.

func BenchmarkSHMPingPong(b *testing.B) {
	tpBenchPingPong(b, tpSHM(NewMemStore(), b.TempDir(), 2, 0), 4<<10)
}

func BenchmarkTCPPingPong(b *testing.B) {
	tpBenchPingPong(b, tpTCP(NewMemStore(), 1, tpSameSecret), 4<<10)
}

func BenchmarkSHMBandwidth(b *testing.B) {
	for _, size := range []int{4 << 20, 64 << 20} {
		b.Run(tpSizeName(size), func(b *testing.B) {
			tpBenchBandwidth(b, tpSHM(NewMemStore(), b.TempDir(), 2, 0), size)
		})
	}
}

func BenchmarkTCPBandwidth(b *testing.B) {
	for _, conns := range []int{1, 2} {
		for _, size := range []int{4 << 20, 64 << 20} {
			b.Run(tpSizeName(size)+map[int]string{1: "", 2: "-2conns"}[conns], func(b *testing.B) {
				tpBenchBandwidth(b, tpTCP(NewMemStore(), conns, tpSameSecret), size)
			})
		}
	}
}

func tpSizeName(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}

// tpBenchPingPong reports the one-way latency of a size-byte message as
// half a round trip.
func tpBenchPingPong(b *testing.B, mk func(int) (Transport, error), size int) {
	x, y := tpPair(b, mk)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range b.N {
			if err := y.Recv(ctx, buf); err != nil {
				done <- err
				return
			}
			if err := y.Send(ctx, buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	buf := make([]byte, size)
	b.ResetTimer()
	for range b.N {
		if err := x.Send(ctx, buf); err != nil {
			b.Fatal(err)
		}
		if err := x.Recv(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "µs/one-way")
}

// tpBenchBandwidth streams size-byte messages one way.
func tpBenchBandwidth(b *testing.B, mk func(int) (Transport, error), size int) {
	x, y := tpPair(b, mk)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range b.N {
			if err := y.Recv(ctx, buf); err != nil {
				done <- err
				return
			}
		}
		done <- y.Send(ctx, nil)
	}()
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if err := x.Send(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := x.Recv(ctx, nil); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSHMAllReduce runs the direct all-reduce of 2 goroutine ranks
// over real shared-memory links, at the sizes around the core's 1 MiB L2
// and with rings of 256 KiB and the default 1 MiB (a chunk is a quarter
// ring at most).
func BenchmarkSHMAllReduce(b *testing.B) {
	for _, size := range []int{512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20} {
		for _, ring := range []int{256 << 10, DefaultSHMRingBytes} {
			b.Run(tpSizeName(size)+"/ring"+tpSizeName(ring), func(b *testing.B) {
				benchAllReduce(b, shmBenchWorld(b, 2, ring, 0), size)
			})
		}
	}
}

// shmBenchWorld connects p goroutine ranks on one host through shared
// memory with the given ring and chunk sizes (0: the defaults).
func shmBenchWorld(b testing.TB, p, ring, chunk int) []*Communicator {
	store := NewMemStore()
	comms := make([]*Communicator, p)
	trs := make([]Transport, p)
	commtest.Must(b, p, nil, func(r int) error {
		var err error
		trs[r], err = Connect(b.Context(), BootstrapConfig{
			Rank: r, Size: p, Store: store, Secret: tpSecret, Prefix: "job/0",
			TCP: TCPConfig{Bind: "127.0.0.1:0", Advertise: "127.0.0.1"},
			SHM: SHMConfig{RingBytes: ring},
		})
		if err != nil {
			return err
		}
		comms[r], err = New(context.Background(), r, p, trs[r], Options{ChunkBytes: chunk})
		return err
	})
	b.Cleanup(func() {
		for r := range p {
			comms[r].Close()
			trs[r].Close()
		}
	})
	return comms
}

//go:build linux

package comm

import (
	"context"
	"strconv"
	"testing"
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

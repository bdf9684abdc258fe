package comm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// newWorld connects size communicators over one NewInProc, and closes them
// when the test ends.
func newWorld(t testing.TB, size int, opts Options) []*Communicator {
	t.Helper()
	comms, _ := newWorldTr(t, size, opts)
	return comms
}

func newWorldTr(t testing.TB, size int, opts Options) ([]*Communicator, []Transport) {
	t.Helper()
	return newWorldOpts(t, size, func(int) Options { return opts })
}

// newWorldOpts is newWorld with options per rank.
func newWorldOpts(t testing.TB, size int, opts func(r int) Options) ([]*Communicator, []Transport) {
	t.Helper()
	trs := NewInProc(size)
	commtest.CloseAtEnd(t, trs)
	comms := commtest.Open(context.Background(), t, size, func(ctx context.Context, r int) (*Communicator, error) {
		return New(ctx, r, size, trs[r], opts(r))
	})
	return comms, trs
}

// testValue is a deterministic pseudo-random multiple of 1/256 in [-4, 4):
// exact in f32 and f16, rounded in bf16.
func testValue(salt, r, i int) float64 {
	h := uint64(salt)*0x9e3779b97f4a7c15 ^ uint64(r+1)*0xbf58476d1ce4e5b9 ^ uint64(i+1)*0x94d049bb133111eb
	h ^= h >> 31
	h *= 0xd6e8feb86659fd39
	h ^= h >> 29
	return float64(int64(h%2048)-1024) / 256
}

// makeInput returns rank r's n test values as a Buffer of dt, and the same
// values (after rounding to dt) as float64.
func makeInput(dt DType, n, salt, r int) (Buffer, []float64) {
	b := NewBuffer(dt, n)
	vals := make([]float64, n)
	for i := range n {
		setF64(b, i, testValue(salt, r, i))
		vals[i] = getF64(b, i)
	}
	return b, vals
}

// garbage returns a Buffer of n elements whose bits are all ones (NaN), to
// show which elements an operation did not write.
func garbage(dt DType, n int) Buffer {
	b := NewBuffer(dt, n)
	for i := range b.b {
		b.b[i] = 0xff
	}
	return b
}

func setF64(b Buffer, i int, x float64) {
	switch b.dt {
	case Float32:
		b.f32()[i] = float32(x)
	case BFloat16:
		b.u16()[i] = BF16FromFloat32(float32(x))
	case Float16:
		b.u16()[i] = F16FromFloat32(float32(x))
	}
}

func getF64(b Buffer, i int) float64 {
	switch b.dt {
	case Float32:
		return float64(b.f32()[i])
	case BFloat16:
		return float64(BF16ToFloat32(b.u16()[i]))
	case Float16:
		return float64(F16ToFloat32(b.u16()[i]))
	}
	panic("no dtype")
}

// unitRoundoff is half an ulp, relative: the error bound of one rounding.
func unitRoundoff(dt DType) float64 {
	switch dt {
	case BFloat16:
		return 0x1p-8
	case Float16:
		return 0x1p-11
	}
	return 0x1p-24
}

// refReduce reduces the ranks' values in float64. tol bounds the error of
// a p-rank reduction done in dt: each of the p-1 combining steps rounds a
// partial result (at most the sum of magnitudes) once, and Avg's division
// rounds once more. Max and Min are exact.
func refReduce(dt DType, op Op, ins [][]float64, lo, hi int) (ref, tol []float64) {
	p := float64(len(ins))
	u := unitRoundoff(dt)
	for i := lo; i < hi; i++ {
		acc, abs := ins[0][i], math.Abs(ins[0][i])
		for _, in := range ins[1:] {
			switch op {
			case Sum, Avg:
				acc += in[i]
			case Max:
				acc = math.Max(acc, in[i])
			case Min:
				acc = math.Min(acc, in[i])
			}
			abs += math.Abs(in[i])
		}
		e := 0.0
		if op == Sum || op == Avg {
			e = (p - 1) * u * abs
		}
		if op == Avg {
			acc /= p
			e = e/p + u*math.Abs(acc)
		}
		ref, tol = append(ref, acc), append(tol, e)
	}
	return ref, tol
}

// checkNear compares got element by element with ref within tol.
func checkNear(t testing.TB, who string, got Buffer, ref, tol []float64) {
	t.Helper()
	if got.Len() != len(ref) {
		t.Fatalf("%s: %d elements, want %d", who, got.Len(), len(ref))
	}
	bad := 0
	for i := range ref {
		if g := getF64(got, i); !(math.Abs(g-ref[i]) <= tol[i]) {
			if bad++; bad <= 3 {
				t.Errorf("%s: element %d = %v, want %v ± %v", who, i, g, ref[i], tol[i])
			}
		}
	}
	if bad > 3 {
		t.Errorf("%s: %d elements wrong in all", who, bad)
	}
}

// checkBits compares got with want bit for bit.
func checkBits(t testing.TB, who string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", who, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: differs from the expected bits at byte %d of %d", who, i, len(got))
		}
	}
}

func TestNewArguments(t *testing.T) {
	tr := NewInProc(2)
	for _, tc := range []struct {
		name       string
		rank, size int
		opts       Options
		want       string
	}{
		{"rank too big", 2, 2, Options{}, "rank 2 out of range for size 2"},
		{"negative rank", -1, 2, Options{}, "rank -1 out of range"},
		{"bad algorithm", 0, 2, Options{Algorithm: "butterfly"}, `unknown algorithm "butterfly"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(t.Context(), tc.rank, tc.size, tr[0], tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestConnectTimeout leaves rank 2 out: New fails on the others after the
// timeout, naming it.
func TestConnectTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		trs := NewInProc(3)
		start := time.Now()
		errs := commtest.Run(2, nil, func(r int) error {
			_, err := New(t.Context(), r, 3, trs[r], Options{Timeout: 10 * time.Second, Hosts: []string{"a", "b", "c"}})
			return err
		})
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("failed after %v", d)
		}
		for r, err := range errs {
			want := fmt.Sprintf("comm: rank %d: connect: peer rank 2 (host c): timed out after 10s waiting for it to join", r)
			if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, ErrTimeout) {
				t.Errorf("rank %d: %v\nwant %s...", r, err, want)
			}
		}
	})
}

func TestSizeOne(t *testing.T) {
	c := newWorld(t, 1, Options{})[0]
	ctx := t.Context()
	buf := F32([]float32{1, 2, 3})
	out := F32(make([]float32, 3))
	if err := c.AllReduce(ctx, buf, Avg); err != nil {
		t.Fatal(err)
	}
	if err := c.ReduceScatter(ctx, buf, out, Sum); err != nil {
		t.Fatal(err)
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if got := out.Float32s(); got[0] != 1 || got[2] != 3 {
		t.Fatalf("reduce_scatter of one rank: %v", got)
	}
	if c.Rank() != 0 || c.Size() != 1 || c.WorldRank(0) != 0 {
		t.Fatalf("rank %d size %d", c.Rank(), c.Size())
	}
}

func TestAsyncInOrder(t *testing.T) {
	const p, n = 4, 1000
	comms := newWorld(t, p, Options{ChunkBytes: 256, RingThreshold: 1024})
	ctx := t.Context()
	type rankBufs struct{ ar, rsIn, rsOut, agIn, agOut, bc Buffer }
	bufs := make([]rankBufs, p)
	ins := make([][]float64, p)
	q := partition{n, p}
	for r := range p {
		bufs[r].ar, ins[r] = makeInput(Float32, n, 1, r)
		bufs[r].rsIn, _ = makeInput(Float32, n, 1, r)
		bufs[r].rsOut = NewBuffer(Float32, q.count(r))
		bufs[r].agIn = q.block(bufs[r].ar, r) // gathers the all-reduce's result: order matters
		bufs[r].agOut = NewBuffer(Float32, n)
		bufs[r].bc, _ = makeInput(Float32, 7, 2, r)
	}
	commtest.Must(t, p, nil, func(r int) error {
		c, b := comms[r], &bufs[r]
		hs := []*Handle{
			c.AllReduceAsync(ctx, b.ar, Sum),
			c.ReduceScatterAsync(ctx, b.rsIn, b.rsOut, Sum),
			c.AllGatherAsync(ctx, b.agIn, b.agOut),
			c.BroadcastAsync(ctx, b.bc, 3),
		}
		for i, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return fmt.Errorf("handle %d: %w", i, err)
			}
		}
		return c.Barrier(ctx)
	})
	ref, tol := refReduce(Float32, Sum, ins, 0, n)
	want, _ := makeInput(Float32, 7, 2, 3)
	for r := range p {
		who := fmt.Sprintf("rank %d", r)
		checkNear(t, who+" all_reduce", bufs[r].ar, ref, tol)
		checkNear(t, who+" reduce_scatter", bufs[r].rsOut, ref[q.offset(r):q.offset(r)+q.count(r)], tol)
		checkBits(t, who+" all_gather", bufs[r].agOut.Bytes(), bufs[0].ar.Bytes())
		checkBits(t, who+" broadcast", bufs[r].bc.Bytes(), want.Bytes())
	}
}

func TestWaitContext(t *testing.T) {
	comms := newWorld(t, 2, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	h := comms[0].AllReduceAsync(t.Context(), F32(make([]float32, 4)), Sum)
	if err := h.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context: %v", err)
	}
	if err := comms[1].AllReduce(t.Context(), F32(make([]float32, 4)), Sum); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the operation did not finish")
	}
	if err := h.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

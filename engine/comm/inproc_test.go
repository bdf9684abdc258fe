package comm

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// connectPair connects ranks 0 and 1 of trs in group.
func connectPair(t *testing.T, trs []Transport, group string) (a, b Conn) {
	t.Helper()
	conns := make([]Conn, 2)
	commtest.Must(t, 2, nil, func(r int) error {
		var err error
		conns[r], err = trs[r].(*InProc).ConnectGroup(t.Context(), 1-r, group)
		return err
	})
	return conns[0], conns[1]
}

func TestInProcMessages(t *testing.T) {
	trs := NewInProc(2)
	a, b := connectPair(t, trs, "")
	errc := make(chan error, 1)
	go func() { errc <- a.Send(t.Context(), []byte("hello")) }()
	got := make([]byte, 5)
	if err := b.Recv(t.Context(), got); err != nil || string(got) != "hello" {
		t.Fatalf("Recv: %q, %v", got, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	go func() { errc <- b.Send(t.Context(), []byte("four")) }()
	if err := a.Recv(t.Context(), make([]byte, 5)); err == nil || !strings.Contains(err.Error(), "message of 4 bytes from rank 1, expected 5") {
		t.Fatalf("Recv of the wrong size: %v", err)
	}
	<-errc
}

func TestInProcGroupsAreSeparate(t *testing.T) {
	trs := NewInProc(2)
	a0, b0 := connectPair(t, trs, "")
	a1, b1 := connectPair(t, trs, "g")
	go a1.Send(t.Context(), []byte{1})
	go a0.Send(t.Context(), []byte{0})
	x, y := make([]byte, 1), make([]byte, 1)
	if err := b0.Recv(t.Context(), x); err != nil || x[0] != 0 {
		t.Fatalf("group \"\": %v %v", x, err)
	}
	if err := b1.Recv(t.Context(), y); err != nil || y[0] != 1 {
		t.Fatalf("group g: %v %v", y, err)
	}
	if _, err := trs[0].Connect(t.Context(), 1); err == nil {
		t.Fatal("a second Connect to the same peer succeeded")
	}
}

func TestInProcClose(t *testing.T) {
	trs := NewInProc(2)
	a, b := connectPair(t, trs, "")
	errc := make(chan error, 1)
	go func() { errc <- b.Recv(t.Context(), make([]byte, 1)) }()
	trs[0].Close()
	if err := <-errc; !errors.Is(err, io.EOF) {
		t.Fatalf("peer's pending Recv: %v, want io.EOF", err)
	}
	if err := b.Send(t.Context(), []byte{1}); !errors.Is(err, io.EOF) {
		t.Fatalf("peer's later Send: %v, want io.EOF", err)
	}
	if err := a.Send(t.Context(), []byte{1}); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("own Send after Close: %v", err)
	}
	if _, err := trs[0].Connect(t.Context(), 1); err == nil {
		t.Fatal("Connect after Close succeeded")
	}
}

func TestInProcCloseAfterSends(t *testing.T) {
	trs := NewInProc(2)
	a, b := connectPair(t, trs, "")
	trs[0].(*InProc).CloseAfterSends(1)
	go b.Recv(t.Context(), make([]byte, 1))
	if err := a.Send(t.Context(), []byte{1}); err != nil {
		t.Fatalf("first Send: %v", err)
	}
	if err := a.Send(t.Context(), []byte{1}); err == nil {
		t.Fatal("second Send went through")
	}
	if err := b.Recv(t.Context(), make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("peer: %v, want io.EOF", err)
	}
}

func TestInProcStallAndContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		trs := NewInProc(2)
		a, b := connectPair(t, trs, "")
		trs[0].(*InProc).Stall()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		go b.Recv(t.Context(), make([]byte, 1)) // ready, but a is stuck
		if err := a.Send(ctx, []byte{1}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("stalled Send: %v", err)
		}
		ctx2, cancel2 := context.WithTimeout(t.Context(), time.Second)
		defer cancel2()
		if err := b.Send(ctx2, []byte{1}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send to a stalled peer: %v", err)
		}
		trs[0].Close()
		trs[1].Close()
	})
}

func TestInProcConnectWaitsForPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		trs := NewInProc(3)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := trs[0].Connect(ctx, 2); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Connect with no peer: %v", err)
		}
		if _, err := trs[0].Connect(t.Context(), 0); err == nil {
			t.Fatal("Connect to self succeeded")
		}
	})
}

func TestMemStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemStore()
		ctx := t.Context()
		got := make(chan []byte)
		go func() {
			v, err := s.Get(ctx, "k")
			if err != nil {
				t.Error(err)
			}
			got <- v
		}()
		synctest.Wait()
		val := []byte("v1")
		if err := s.Set(ctx, "k", val); err != nil {
			t.Fatal(err)
		}
		val[0] = 'x' // the store keeps its own copy
		if v := <-got; string(v) != "v1" {
			t.Fatalf("Get: %q", v)
		}
		s.Set(ctx, "k", []byte("v2"))
		if v, _ := s.Get(ctx, "k"); string(v) != "v2" {
			t.Fatalf("Get after overwrite: %q", v)
		}
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := s.Get(tctx, "missing"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get of a missing key: %v", err)
		}
	})
}

package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

var bg = context.Background()

// TestGetWaitsForSet: a Get waits for its key, another client's Set ends
// the wait, and the wait blocks nothing else on the waiting connection.
func TestGetWaitsForSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startPipe(t)
		waiter, setter := e.client(t), e.client(t)
		got := make(chan string, 1)
		go func() {
			v, err := waiter.Get(bg, "addr/0")
			got <- fmt.Sprint(string(v), err)
		}()
		synctest.Wait()
		select {
		case g := <-got:
			t.Fatalf("Get returned %q before any Set", g)
		default:
		}
		if err := waiter.Set(bg, "other", []byte("x")); err != nil { // same connection, not blocked
			t.Fatal(err)
		}
		if err := setter.Set(bg, "addr/0", []byte("10.0.0.7:1234")); err != nil {
			t.Fatal(err)
		}
		if g := <-got; g != "10.0.0.7:1234<nil>" {
			t.Errorf("Get = %q, want the value set by the other client", g)
		}
	})
}

// TestGetTimeout: ctx bounds the wait, the server forgets the waiter, and the
// connection stays usable.
func TestGetTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startPipe(t)
		c := e.client(t)
		ctx, cancel := context.WithTimeout(bg, 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.Get(ctx, "never")
		if !errors.Is(err, context.DeadlineExceeded) || err.Error() != `rendezvous: get "never": context deadline exceeded` {
			t.Fatalf("Get = %v, want a deadline error naming the key", err)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("Get gave up after %v, want 2s", d)
		}
		synctest.Wait()
		e.srv.store.mu.Lock()
		waits := len(e.srv.store.waits)
		e.srv.store.mu.Unlock()
		if waits != 0 {
			t.Errorf("server still holds %d waiters after the client gave up", waits)
		}
		if err := c.Set(bg, "never", []byte("now")); err != nil {
			t.Fatalf("Set after a timed-out Get: %v", err)
		}
	})
}

func TestBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startPipe(t)
		done := make(chan error, 3)
		arrive := func(ctx context.Context, n int) {
			c := e.client(t)
			go func() { done <- c.Barrier(ctx, "init", n) }()
			synctest.Wait()
		}
		// One arrival gives up: it must not count.
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		arrive(ctx, 3)
		time.Sleep(time.Second)
		if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Barrier past its deadline = %v", err)
		}
		arrive(bg, 3)
		arrive(bg, 3)
		if len(done) != 0 {
			t.Fatal("barrier opened with 2 of 3 clients")
		}
		if err := e.client(t).Barrier(bg, "init", 4); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "others wait for 3") {
			t.Errorf("Barrier with another n = %v", err)
		}
		arrive(bg, 3)
		for range 3 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if len(e.srv.store.barriers) != 0 {
			t.Errorf("barrier state left behind: %v", e.srv.store.barriers)
		}
	})
}

// TestClientLimits: the client refuses what the server would, before
// sending it, with an error naming the operation and the key.
func TestClientLimits(t *testing.T) {
	c := startTCP(t).client(t)
	long := strings.Repeat("k", MaxKey+1)
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"key too long", func() error { return c.Set(bg, long, nil) }, ErrTooLarge},
		{"empty key", func() error { _, err := c.Get(bg, ""); return err }, ErrBadRequest},
		{"key not UTF-8", func() error { return c.Set(bg, "\xff", nil) }, ErrBadRequest},
		{"value too large", func() error { return c.Set(bg, "k", make([]byte, MaxValue+1)) }, ErrTooLarge},
		{"cas old too large", func() error { _, _, err := c.CompareAndSet(bg, "k", make([]byte, MaxValue+1), nil); return err }, ErrTooLarge},
		{"barrier name too long", func() error { return c.Barrier(bg, long, 2) }, ErrTooLarge},
		{"barrier of zero", func() error { return c.Barrier(bg, "b", 0) }, ErrBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "rendezvous: ") {
				t.Errorf("error = %v, want %v", err, tt.want)
			}
		})
	}
	// The largest values fit, a CompareAndSet carrying two of them too.
	big := bytes.Repeat([]byte{0xab}, MaxValue)
	if err := c.Set(bg, "big", big); err != nil {
		t.Fatal(err)
	}
	if ok, cur, err := c.CompareAndSet(bg, "big", big, bytes.Repeat([]byte{1}, MaxValue)); err != nil || !ok || len(cur) != MaxValue {
		t.Errorf("CompareAndSet of two %d-byte values = %v, %d bytes, %v", MaxValue, ok, len(cur), err)
	}
}

// TestServerLimits: a client that ignores the limits is refused and cut off.
func TestServerLimits(t *testing.T) {
	tests := []struct {
		name, line, code string
	}{
		{"message too long", `{"v":1,"type":"set","id":1,"key":"k","value":"` + strings.Repeat("A", MaxMessage) + `"}`, codeTooLarge},
		{"value too large", fmt.Sprintf(`{"v":1,"type":"set","id":1,"key":"k","value":"%s"}`, strings.Repeat("AAAA", MaxValue/3+1)), codeTooLarge},
		{"key too long", fmt.Sprintf(`{"v":1,"type":"get","id":1,"key":"%s"}`, strings.Repeat("k", MaxKey+1)), codeTooLarge},
		{"no id", `{"v":1,"type":"get","key":"k"}`, codeBadRequest},
		{"server-only type", `{"v":1,"type":"welcome"}`, codeBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startTCP(t)
			r := e.raw(t)
			r.handshake(e.secret)
			go r.nc.Write([]byte(tt.line + "\n")) // may fail: the server stops reading
			if m := r.read(); m == nil || m.Type != typeError || m.Code != tt.code {
				t.Fatalf("got %+v, want an error with code %s", m, tt.code)
			}
			if m := r.read(); m != nil {
				t.Errorf("got %+v, want the connection closed", m)
			}
		})
	}
}

func TestStoreFull(t *testing.T) {
	s := newStore()
	s.limit = 10
	if err := s.set("abc", []byte("1234567")); err != nil {
		t.Fatal(err)
	}
	if err := s.set("d", nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("set past the limit = %v, want ErrTooLarge", err)
	}
	if err := s.set("abc", []byte("123")); err != nil || s.size != 6 {
		t.Errorf("overwrite with a smaller value = %v, size %d; want 6", err, s.size)
	}
}

func TestInflightLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := startPipe(t)
		c := e.client(t)
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		for i := range maxInflight {
			go c.Get(ctx, fmt.Sprint("k", i))
		}
		synctest.Wait()
		if _, err := c.Get(ctx, "one too many"); !errors.Is(err, ErrBusy) {
			t.Errorf("Get past the in-flight limit = %v, want ErrBusy", err)
		}
		if err := c.Set(bg, "k0", nil); err != nil { // quick requests still pass
			t.Fatal(err)
		}
	})
}

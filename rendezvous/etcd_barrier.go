package rendezvous

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// addCounter is the counter at key (held: v is its value) plus delta, with
// the built-in store's errors.
func addCounter(key string, v []byte, held bool, delta int64) (int64, error) {
	var n int64
	if held {
		var err error
		if n, err = strconv.ParseInt(string(v), 10, 64); err != nil {
			return 0, errorf(codeBadRequest, "add to %q: value is not a decimal integer", clip(key))
		}
	}
	if (delta > 0 && n > math.MaxInt64-delta) || (delta < 0 && n < math.MinInt64-delta) {
		return 0, errorf(codeBadRequest, "add %d to %q: overflows int64", delta, clip(key))
	}
	return n + delta, nil
}

// barrierState is a barrier's key: generation g opens when count reaches
// n, which starts generation g+1 at count 0.
type barrierState struct{ gen, count, n int64 }

func parseBarrier(v []byte) (barrierState, bool) {
	var s barrierState
	_, err := fmt.Sscanf(string(v), "%d %d %d", &s.gen, &s.count, &s.n)
	return s, err == nil
}

func (s barrierState) bytes() []byte { return fmt.Appendf(nil, "%d %d %d", s.gen, s.count, s.n) }

// Barrier returns once n clients reached the barrier called name: a counter
// in a transaction, then a watch for the generation to move on. A client
// whose ctx ends first takes its arrival back.
func (c *EtcdClient) Barrier(ctx context.Context, name string, n int) error {
	target := fmt.Sprintf("%q", clip(name))
	err := checkBarrier(&message{ID: 1, Name: name, N: n})
	if err != nil {
		return fmt.Errorf("rendezvous: etcd %s: barrier %s: %w", c.where, target, err)
	}
	k := c.cfg.Prefix + "/barrier/" + name
	gen, rev, opened, err := c.arrive(ctx, k, name, int64(n))
	if err != nil || opened {
		return err
	}
	err = c.waitGen(ctx, k, gen, rev+1)
	if ctx.Err() == nil {
		return err
	}
	return c.leave(ctx, k, gen)
}

// arrive counts this client in; opened when it was the n-th. Its writes
// outlive ctx (for a few seconds at most), so that an arrival is never
// counted without the caller knowing it, who could not take it back.
func (c *EtcdClient) arrive(ctx context.Context, k, name string, n int64) (gen, rev int64, opened bool, err error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), etcdDialTimeout)
	defer cancel()
	for {
		if ctx.Err() != nil {
			return 0, 0, false, c.errf(k, "barrier", context.Cause(ctx))
		}
		v, mod, _, err := c.read(actx, k, "barrier")
		if err != nil {
			return 0, 0, false, err
		}
		s, ok := parseBarrier(v)
		if mod != 0 && !ok {
			return 0, 0, false, c.errf(k, "barrier", fmt.Errorf("malformed barrier state: %w", ErrBadRequest))
		}
		if s.count > 0 && s.n != n {
			return 0, 0, false, c.errf(k, "barrier", errorf(codeBadRequest, "barrier %q: waiting for %d clients, others wait for %d", clip(name), n, s.n))
		}
		next := barrierState{gen: s.gen, count: s.count + 1, n: n}
		if next.count == n {
			next = barrierState{gen: s.gen + 1, n: n}
		}
		ok, rev, err := c.swap(actx, k, "barrier", mod, next.bytes())
		if err != nil || ok {
			return s.gen, rev, next.gen > s.gen, err
		}
	}
}

// waitGen watches k from rev until its generation passes gen.
func (c *EtcdClient) waitGen(ctx context.Context, k string, gen, rev int64) error {
	for {
		wctx, cancel := context.WithCancel(ctx)
		wch := c.cli.Watch(wctx, k, clientv3.WithRev(rev))
		for wr := range wch {
			if wr.Err() != nil {
				break // compacted: read again below
			}
			for _, ev := range wr.Events {
				v, err := c.open(k, ev.Kv.Value)
				if err != nil {
					cancel()
					return err
				}
				if s, ok := parseBarrier(v); ok && s.gen > gen {
					cancel()
					return nil
				}
			}
		}
		cancel()
		if ctx.Err() != nil {
			return c.errf(k, "barrier", c.ended(ctx))
		}
		v, _, now, err := c.read(ctx, k, "barrier")
		if err != nil {
			return err
		}
		if s, ok := parseBarrier(v); ok && s.gen > gen {
			return nil
		}
		rev = now + 1
	}
}

// leave takes back an arrival at generation gen, unless it opened as the
// client gave up (then it counted, and the barrier returns nil).
func (c *EtcdClient) leave(ctx context.Context, k string, gen int64) error {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for {
		v, mod, _, err := c.read(lctx, k, "barrier")
		if err != nil {
			return err
		}
		s, ok := parseBarrier(v)
		if !ok || s.gen > gen {
			return nil
		}
		s.count--
		swapped, _, err := c.swap(lctx, k, "barrier", mod, s.bytes())
		if err != nil {
			return err
		}
		if swapped {
			return c.errf(k, "barrier", context.Cause(ctx))
		}
	}
}

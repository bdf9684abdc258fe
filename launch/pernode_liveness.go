package launch

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// How a per-node attempt judges liveness through the job's store
// (pernode_watch.go): a watched node's beat counter standing still, and
// the store itself not answering.

// storeOutage is how long the store may fail every request before a node
// stops: six times the nodes' silence limit, at least 30 s, so that an
// etcd restarted (or rescheduled by Kubernetes) is waited for.
func storeOutage(beat time.Duration) time.Duration {
	return max(6*SilentAfter(beat), 30*time.Second)
}

// answered records the outcome of a store request: an answer ends an
// outage; the first failure after one starts it. The count starts at a
// failure, not at the last answer, so that a process that was itself held
// up (stopped, swapped out) does not count its own pause as the store's.
func (na *nodeAttempt) answered(err error) {
	if err != nil && na.ctx.Err() != nil {
		return // the attempt ended: not the store's failure
	}
	na.mu.Lock()
	defer na.mu.Unlock()
	switch {
	case err == nil:
		na.failing = time.Time{}
	case na.failing.IsZero():
		na.failing = time.Now()
	}
}

// outage is how long every store request has failed, as of now.
func (na *nodeAttempt) outage(now time.Time) time.Duration {
	na.mu.Lock()
	defer na.mu.Unlock()
	if na.failing.IsZero() {
		return 0
	}
	return now.Sub(na.failing)
}

// beatWatch judges one node's beat counter, read about every beat.
type beatWatch struct {
	limit   time.Duration // SilentAfter the beat
	last    int64         // the counter's last value; -1 before the first read
	changed time.Time     // when it last moved, or the count started again
	failed  time.Time     // the first failed read of a store outage
}

// check takes a read of the counter made at at (v, or err) and returns how
// long the counter has stood still, once that reaches the limit; else 0.
// A failed read, or a check held up, judges nobody and starts the count
// again. When the store answers after an outage, the watched node's own
// connection may come back as much later as the outage lasted (gRPC's
// reconnect backoff grows with the outage), so the count starts again
// that much later: else a node alive all along is judged lost.
func (w *beatWatch) check(v int64, err error, held bool, at time.Time) time.Duration {
	switch {
	case err != nil:
		if w.failed.IsZero() {
			w.failed = at
		}
		w.changed = at
	case !w.failed.IsZero():
		w.last, w.changed, w.failed = v, at.Add(at.Sub(w.failed)), time.Time{}
	case held:
		w.changed = at
	case v != w.last:
		w.last, w.changed = v, at
	case at.Sub(w.changed) >= w.limit:
		return at.Sub(w.changed)
	}
	return 0
}

// storeLost stops the attempt for good when the store has failed every
// request for d: every peer not done ends with the reason, so the local
// attempt fails and tears its ranks down. Nothing is written: the store is
// what is missing; each node finds the outage itself.
func (na *nodeAttempt) storeLost(d time.Duration) {
	err := na.pn.outageErr(d, "this node cannot tell whether the other nodes are alive, done or failed, so it stops rather than wait for them")
	na.mu.Lock()
	if na.stop != nil {
		na.mu.Unlock()
		return
	}
	me := na.name(na.me)
	na.stop = &nodeStop{By: me, Node: me, Reason: err.Error(), Final: true}
	na.final, na.lostErr = true, err
	peers := na.peers
	na.mu.Unlock()
	for _, p := range peers {
		if p != nil {
			p.end(err)
		}
	}
}

// outageErr is the error of a node that stops because the store has
// failed every request for d; why says what it could not do.
func (pn *perNode) outageErr(d time.Duration, why string) error {
	name, check := pn.storeName()
	return fmt.Errorf("%s has not answered for %v: %s (check that %s; then start the job again with a new --rdzv-id)", name, d.Round(time.Second), why, check)
}

// watchStore asks the store something every beat until ctx ends, and
// cancels ctx once every request has failed for storeOutage(beat): a spare
// waits for the next round in requests that wait as long as the store is
// away, and would wait for ever for a store gone for good. As in
// nodeAttempt.answered, the outage counts from the first failed request.
func (pn *perNode) watchStore(ctx context.Context, beat time.Duration, cancel context.CancelCauseFunc) {
	t := time.NewTicker(beat)
	defer t.Stop()
	var failing time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := pn.probe(ctx, beat)
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			failing = time.Time{}
		case failing.IsZero():
			failing = now
		case now.Sub(failing) >= storeOutage(beat):
			cancel(pn.outageErr(now.Sub(failing), "this spare node cannot learn when the next round starts, so it stops rather than wait for it"))
			return
		}
	}
}

// probe asks the store to compare a key no node writes: a read that
// writes nothing and does not wait for the key, within beat.
func (pn *perNode) probe(ctx context.Context, beat time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, beat)
	defer cancel()
	_, _, err := pn.store.CompareAndSet(ctx, "pernode/probe", []byte("-"), []byte("-"))
	return err
}

// The attempt's done key is a set, a bit per node in rank order, not a
// count: setting a bit again changes nothing, so a node whose write was
// applied but whose reply was lost (etcd restarting, a request timed out)
// and that writes again counts once. A counter would count it twice, and
// the others would end their wait for a node still running.

// doneLen is the size of the done set in bytes.
func (na *nodeAttempt) doneLen() int { return (len(na.members) + 7) / 8 }

// isSet says whether node i's bit is set in a done set (nil: none is).
func isSet(set []byte, i int) bool { return i/8 < len(set) && set[i/8]&(1<<(i%8)) != 0 }

// doneSet reads the done set without waiting (the store's Get waits for
// a missing key): a compare-and-set against a value longer than any set
// never swaps, and returns what the key holds.
func (na *nodeAttempt) doneSet() ([]byte, error) {
	ctx, cancel := context.WithTimeout(na.ctx, na.beat)
	defer cancel()
	never := make([]byte, na.doneLen()+1)
	_, cur, err := na.pn.store.CompareAndSet(ctx, na.key("done"), never, never)
	if err == nil {
		err = na.checkDone(cur)
	}
	na.answered(err)
	return cur, err
}

// checkDone checks a done set read from the store (nil: empty).
func (na *nodeAttempt) checkDone(set []byte) error {
	if set != nil && len(set) != na.doneLen() {
		return fmt.Errorf("launch: malformed done set of attempt %d in the store: %d bytes, want %d for %d nodes", na.n, len(set), na.doneLen(), len(na.members))
	}
	return nil
}

// setDone sets this node's bit in the done set, unless it is set already
// (an earlier try that took, its reply lost). A swap fails only when
// another node set its bit, so it takes at most one try a node.
func (na *nodeAttempt) setDone(ctx context.Context) error {
	var cur []byte
	for range len(na.members) + 1 {
		next := make([]byte, na.doneLen())
		copy(next, cur)
		next[na.me/8] |= 1 << (na.me % 8)
		if bytes.Equal(next, cur) {
			return nil
		}
		ok, now, err := na.pn.store.CompareAndSet(ctx, na.key("done"), cur, next)
		if err != nil || ok {
			return err
		}
		if err := na.checkDone(now); err != nil {
			return err
		}
		cur = now
	}
	return fmt.Errorf("launch: attempt %d's done set in the store changed more often than it has nodes (%d)", na.n, len(na.members))
}

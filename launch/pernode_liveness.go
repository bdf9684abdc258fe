package launch

import (
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
	name, check := na.pn.storeName()
	err := fmt.Errorf("%s has not answered for %v: this node cannot tell whether the other nodes are alive, done or failed, "+
		"so it stops rather than wait for them (check that %s; then start the job again with a new --rdzv-id)", name, d.Round(time.Second), check)
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

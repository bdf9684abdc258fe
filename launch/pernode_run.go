package launch

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gtrain/gtrain/rendezvous"
)

// The runs of a per-node job. A scheduler that starts every node of a job
// again (Kubernetes restarting its pods, with the same --rdzv-id) finds
// the store still holding the last run's rounds: its nodes would join a
// closed round as spares and wait for ever, or find the job ended. So each
// run has rounds of its own, numbered on after the last run's, from its
// first round F, which runKey holds (missing: 0, the job's first run);
// the run's end and its leavers are kept under F (pernode/F/end, left).
// A node that starts looks at the current run's newest round:
//
//   - none yet, or still open: it joins it (the job's first start, or a
//     round forming);
//   - closed, and within the silence limit a member beats, or a newer
//     round or the run's end appears: the run is live, and the node joins
//     its next round as a spare, as before;
//   - closed and still for the silence limit (its nodes were killed), or
//     the run ended in failure: the node starts the next run at the round
//     after it, with a compare-and-set every such node makes alike;
//   - the run ended well: the job is done, and the node says so and exits
//     0: a pod started again after its job succeeded must not run it a
//     second time (a new job takes a new --rdzv-id).

// runKey holds the first round of the job's current run.
const runKey = "pernode/run"

// maxRounds bounds the rounds of one run a node looks through (each a
// restart, or a spare's wait).
const maxRounds = 1 << 16

// findRun sets pn.first to the first round of the run this node is to
// join, starting the next run when the current one is dead or failed, and
// returns the round to join: the run's newest.
func (pn *perNode) findRun(ctx context.Context) (int, error) {
	beat := cmp.Or(pn.base.Heartbeat, 5*time.Second)
	for range 8 { // each try another node moved the run on
		raw, err := pn.peek(ctx, runKey, beat)
		if err != nil {
			return 0, pn.runErr("read the job's run", err)
		}
		first := 0
		if raw != nil {
			if first, err = strconv.Atoi(string(raw)); err != nil || first < 0 {
				return 0, fmt.Errorf("launch: malformed run %q in the job's store at %s", raw, pn.endpoint)
			}
		}
		pn.first = first
		last, live, err := pn.runState(ctx, first, beat)
		if err != nil || live {
			return max(last, first), err
		}
		next := []byte(strconv.Itoa(last + 1))
		ok, cur, err := pn.store.CompareAndSet(ctx, runKey, raw, next)
		if err != nil {
			return 0, pn.runErr("start the job's next run", err)
		}
		if ok || bytes.Equal(cur, next) { // another node started it alike
			pn.first = last + 1
			return pn.first, nil
		}
	}
	return 0, fmt.Errorf("launch: the job's run at %s kept changing while this node looked: start it again", pn.endpoint)
}

// runState returns the newest round of the run that starts at round
// first (-1: none) and whether this node joins the run (live) rather than
// start the next; a run that ended well is a *jobEndedError.
func (pn *perNode) runState(ctx context.Context, first int, beat time.Duration) (last int, live bool, err error) {
	last, closed, err := pn.newestRound(ctx, first, beat)
	if err != nil {
		return 0, false, err
	}
	end, err := pn.peek(ctx, pn.endKey(), beat)
	if err != nil {
		return 0, false, pn.runErr("read the run's end", err)
	}
	switch {
	case end != nil:
		if err := endedBy(end); !isFailedEnd(err) {
			return 0, false, err
		}
		return max(last, first), false, nil // the next run begins after its rounds, and its end
	case last < 0 || !closed:
		return last, true, nil
	}
	moved, err := pn.runMoves(ctx, last, beat)
	return last, moved, err
}

// isFailedEnd says whether err is the end of a run that failed.
func isFailedEnd(err error) bool {
	je, ok := err.(*jobEndedError)
	return ok && !je.end.OK
}

// newestRound is the run's newest round (-1: none) and whether it closed.
func (pn *perNode) newestRound(ctx context.Context, first int, beat time.Duration) (int, bool, error) {
	last := -1
	for n := first; n < first+maxRounds; n++ {
		v, err := pn.peek(ctx, roundKey(n, "count"), beat)
		if err != nil {
			return 0, false, pn.runErr("read round "+strconv.Itoa(n), err)
		}
		if v == nil {
			break
		}
		last = n
	}
	if last < 0 {
		return -1, false, nil
	}
	v, err := pn.peek(ctx, roundKey(last, "closed"), beat)
	if err != nil {
		return 0, false, pn.runErr("read round "+strconv.Itoa(last), err)
	}
	return last, v != nil, nil
}

// runMoves watches closed round n for the silence limit and a beat more:
// true once a member's beat changes, or the next round or the run's end
// appears.
func (pn *perNode) runMoves(ctx context.Context, n int, beat time.Duration) (bool, error) {
	names, err := pn.roundNames(ctx, n, beat)
	if err != nil {
		return false, err
	}
	keys := []string{roundKey(n+1, "count"), pn.endKey()}
	for _, name := range names {
		keys = append(keys, roundKey(n, "beat/"+name))
	}
	first, err := pn.peekAll(ctx, keys, beat)
	if err != nil {
		return false, err
	}
	t := time.NewTicker(beat)
	defer t.Stop()
	for end := time.Now().Add(SilentAfter(beat) + beat); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return false, context.Cause(ctx)
		case <-t.C:
		}
		now, err := pn.peekAll(ctx, keys, beat)
		if err != nil {
			return false, err
		}
		for i := range keys {
			if !bytes.Equal(now[i], first[i]) {
				return true, nil
			}
		}
	}
	return false, nil
}

// roundNames are the names of closed round n's members.
func (pn *perNode) roundNames(ctx context.Context, n int, beat time.Duration) ([]string, error) {
	v, err := pn.peek(ctx, roundKey(n, "closed"), beat)
	if err != nil {
		return nil, pn.runErr("read round "+strconv.Itoa(n), err)
	}
	size, err := parseSize(v)
	if err != nil || size > maxRounds {
		return nil, fmt.Errorf("launch: round %d in the job's store at %s: %v", n, pn.endpoint, cmp.Or(err, fmt.Errorf("%d members", size)))
	}
	var names []string
	for i := range size {
		raw, err := pn.peek(ctx, roundKey(n, "member/"+strconv.FormatInt(i+1, 10)), beat)
		if err != nil {
			return nil, pn.runErr("read round "+strconv.Itoa(n), err)
		}
		var m nodeInfo
		if raw != nil && json.Unmarshal(raw, &m) == nil {
			names = append(names, m.Name)
		}
	}
	return names, nil
}

// peekAll peeks at every key.
func (pn *perNode) peekAll(ctx context.Context, keys []string, beat time.Duration) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		v, err := pn.peek(ctx, k, beat)
		if err != nil {
			return nil, pn.runErr("read "+k, err)
		}
		out[i] = v
	}
	return out, nil
}

// peek reads key without waiting for it (nil: missing) and without
// writing: a compare-and-set against a value no key holds never swaps.
// A store away for the outage limit is an error.
func (pn *perNode) peek(ctx context.Context, key string, beat time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, storeOutage(beat))
	defer cancel()
	never := []byte("\x00gtrain: never a value\x00")
	_, cur, err := pn.store.CompareAndSet(ctx, key, never, never)
	return cur, err
}

// runErr names the store in a failed request of findRun; a value another
// secret signed says what to check, as in storeErr.
func (pn *perNode) runErr(op string, err error) error {
	if errors.Is(err, rendezvous.ErrAuth) {
		return fmt.Errorf("launch: %s at %s: %w (every node must have the same --rdzv-secret-file or %s)", op, pn.endpoint, err, SecretEnv)
	}
	return fmt.Errorf("launch: %s at %s: %w", op, pn.endpoint, err)
}

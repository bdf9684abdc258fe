package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
)

// TestPerNodeAttemptEvent: a per-node node's JSON events begin each
// attempt with an attempt event naming the whole job's world (both
// nodes' ranks), as the SSH launcher's do, and a rank that fails makes the
// next attempt's event say attempt 1.
func TestPerNodeAttemptEvent(t *testing.T) {
	endpoint := freeLoopbackPort(t)
	// Rank 0 fails in the first attempt only (TORCHELASTIC_RESTART_COUNT).
	script := `if [ "$RANK" = 0 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 3; fi`
	nodes := []*node{
		loopbackNode(t, endpoint, "events", 0, "--output", "json", "--max-restarts", "1", "--", "sh", "-c", script),
		loopbackNode(t, endpoint, "events", 1, "--output", "json", "--max-restarts", "1", "--", "sh", "-c", script),
	}
	for i, n := range nodes {
		if code := n.wait(t, 2*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s", i, code, n.err.String())
		}
	}
	for i, n := range nodes {
		var attempts []proto.Event
		sc := bufio.NewScanner(strings.NewReader(n.out.String()))
		for sc.Scan() {
			var e proto.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("node %d: a line that is no event: %q: %v", i, sc.Text(), err)
			}
			if e.Type == proto.EventAttempt {
				attempts = append(attempts, e)
			}
		}
		if len(attempts) != 2 || attempts[0].Attempt != 0 || attempts[1].Attempt != 1 || attempts[0].World != 2 || attempts[1].World != 2 {
			t.Errorf("node %d: attempt events %+v; want attempts 0 and 1, each of a world of 2 ranks\n%s", i, attempts, n.out.String())
		}
	}
}

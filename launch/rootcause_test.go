package launch

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
)

// TestRootCause: the rule that picks the failure to blame does not depend on
// the order the failures are listed (arrived) in.
func TestRootCause(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	exit := func(rank, code int, ms int) *RankFailedError {
		return &RankFailedError{Host: "h", Rank: rank, Code: code, PID: 100 + rank, Time: at(ms)}
	}
	killed := func(rank int, sig string, code, ms int) *RankFailedError {
		r := exit(rank, code, ms)
		r.Signal = sig
		return r
	}
	peer := func(rank, ms int) *RankFailedError {
		r := exit(rank, 1, ms)
		r.PeerFailed = true
		return r
	}
	lost := func(node, ms int) *AgentLostError {
		return &AgentLostError{Host: "h" + string(rune('0'+node)), Node: node, Err: errors.New("gone"), at: at(ms)}
	}
	tests := []struct {
		name  string
		ranks []*RankFailedError
		lost  []*AgentLostError
		want  string // the root's short description
		also  string // the others, in order
	}{
		{"signal beats an earlier peer failure", []*RankFailedError{peer(0, 1), killed(1, "SIGKILL", 137, 5)}, nil,
			"rank 1 on h was killed by SIGKILL", "rank 0 on h exited with code 1 (its peer was gone)"},
		{"signal beats an earlier exit", []*RankFailedError{exit(0, 3, 1), killed(1, "SIGSEGV", 139, 9)}, nil,
			"rank 1 on h was killed by SIGSEGV", "rank 0 on h exited with code 3"},
		{"earliest exit wins", []*RankFailedError{exit(2, 4, 7), exit(1, 5, 3)}, nil,
			"rank 1 on h exited with code 5", "rank 2 on h exited with code 4"},
		{"same time: lowest rank", []*RankFailedError{exit(2, 4, 3), exit(1, 5, 3)}, nil,
			"rank 1 on h exited with code 5", "rank 2 on h exited with code 4"},
		{"an exit beats an earlier peer failure", []*RankFailedError{peer(0, 1), exit(1, 6, 2)}, nil,
			"rank 1 on h exited with code 6", "rank 0 on h exited with code 1 (its peer was gone)"},
		{"only peer failures: the earliest", []*RankFailedError{peer(1, 4), peer(0, 2)}, nil,
			"rank 0 on h exited with code 1 (its peer was gone)", "rank 1 on h exited with code 1 (its peer was gone)"},
		{"a lost host beats the peers it left", []*RankFailedError{peer(0, 1)}, []*AgentLostError{lost(1, 9)},
			"agent on h1 (node 1) lost", "rank 0 on h exited with code 1 (its peer was gone)"},
		{"a lost host beats an exit", []*RankFailedError{exit(0, 2, 1)}, []*AgentLostError{lost(1, 9)},
			"agent on h1 (node 1) lost", "rank 0 on h exited with code 2"},
		{"a signal beats a lost host", []*RankFailedError{killed(3, "SIGKILL", 137, 9)}, []*AgentLostError{lost(1, 1)},
			"rank 3 on h was killed by SIGKILL", "agent on h1 (node 1) lost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Both orders of arrival give the same answer.
			for _, order := range []string{"given", "reversed"} {
				ranks, lost := clone(tt.ranks), clone(tt.lost)
				if order == "reversed" {
					reverse(ranks)
					reverse(lost)
				}
				err, report := rootCause(ranks, lost)
				var got string
				switch e := err.(type) {
				case *RankFailedError:
					got = e.short()
				case *AgentLostError:
					got = e.short()
				}
				if got != tt.want {
					t.Errorf("%s order: root = %q, want %q", order, got, tt.want)
				}
				if want := "\nalso failed: " + tt.also; !strings.HasSuffix(report, want) {
					t.Errorf("%s order: report %q does not end with %q", order, report, want)
				}
			}
		})
	}
}

func clone[T any](s []*T) []*T {
	out := make([]*T, len(s))
	for i, p := range s {
		c := *p
		out[i] = &c
	}
	return out
}

func reverse[T any](s []T) {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
}

// TestRunBlamesTheRankThatWasKilled: rank 0 exits first saying its peer is
// gone; rank 1's SIGKILL (not gtrain's) arrives after. The job's error is
// rank 1's, with rank 0 named as also failed.
func TestRunBlamesTheRankThatWasKilled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{}
		p := fakeJob(t, 2)
		rec := &recorder{}
		errc := make(chan error, 1)
		go func() { errc <- Run(t.Context(), p, Runtime{Transport: tr, View: rec}) }()
		synctest.Wait()
		killedAt := time.Now()
		time.Sleep(time.Second) // rank 0 notices only later that its peer is gone
		tr.conns[0].events <- proto.Event{V: proto.Version, Type: proto.EventRankExited, Time: time.Now(), Host: "worker-0",
			Node: 0, Rank: 0, PID: 10, Code: 1, PeerFailed: true, Message: "comm: rank 0: all_reduce #3: peer rank 1: peer process is gone"}
		synctest.Wait()
		tr.conns[1].events <- proto.Event{V: proto.Version, Type: proto.EventRankExited, Time: killedAt, Host: "worker-1",
			Node: 1, Rank: 1, PID: 11, Code: 137, Signal: "SIGKILL"}
		for _, c := range tr.conns {
			c.send(proto.EventDone, -1, 0)
			c.Kill()
		}
		err := <-errc
		var rf *RankFailedError
		if !errors.As(err, &rf) || rf.Rank != 1 || rf.Code != 137 {
			t.Fatalf("Run error = %v, want rank 1 killed by SIGKILL (code 137)", err)
		}
		notices := rec.ofType(proto.EventNotice)
		if len(notices) == 0 {
			t.Fatal("no notices")
		}
		report := notices[len(notices)-1].Message
		for _, want := range []string{"rank 1 (local rank 0) on worker-1 was killed by SIGKILL", "also failed: rank 0 on worker-0 exited with code 1 (its peer was gone)"} {
			if !strings.Contains(report, want) {
				t.Errorf("report %q does not say %q", report, want)
			}
		}
	})
}

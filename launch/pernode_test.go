package launch

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/rendezvous"
)

// TestAssignRanks: given node ranks are kept, the others fill the free
// ranks in the order of their names whatever the order of joining, and
// every node computes the same order; clashes are refused naming both.
func TestAssignRanks(t *testing.T) {
	n := func(name string, rank int) nodeInfo { return nodeInfo{Name: name, Rank: rank} }
	for _, tt := range []struct {
		name    string
		joined  []nodeInfo
		want    string // names in rank order
		wantErr string
	}{
		{"auto by name", []nodeInfo{n("c", -1), n("a", -1), n("b", -1)}, "a b c", ""},
		{"given", []nodeInfo{n("a", 2), n("b", 0), n("c", 1)}, "b c a", ""},
		{"mixed", []nodeInfo{n("z", 0), n("b", -1), n("a", -1)}, "z a b", ""},
		{"clash", []nodeInfo{n("a", 1), n("b", 1)}, "", "node a and node b both have --node-rank 1"},
		{"past the end", []nodeInfo{n("a", 0), n("b", 2)}, "", "node b has --node-rank 2, but the job has 2 nodes"},
		{"same name", []nodeInfo{n("a", -1), n("a", -1)}, "", "two nodes named a joined the job"},
		{"other job", []nodeInfo{{Name: "a", Rank: -1, Job: "d1"}, {Name: "b", Rank: -1, Job: "d2"}}, "", "node b runs another job than node a (job digest d2, not d1)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for mine := range tt.joined {
				out, rank, err := assignRanks(tt.joined, mine)
				if tt.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
						t.Fatalf("err %v, want %q", err, tt.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got := nodeNames(out); got != strings.ReplaceAll(tt.want, " ", ", ") {
					t.Errorf("order %s, want %s", got, tt.want)
				}
				if out[rank].Name != tt.joined[mine].Name {
					t.Errorf("node %s got rank %d, which is %s's", tt.joined[mine].Name, rank, out[rank].Name)
				}
			}
		})
	}
}

// TestCheckPerNode: per-node mode's flags are checked before any I/O.
func TestCheckPerNode(t *testing.T) {
	ok := Request{NNodes: "3", NodeRank: "auto", RendezvousEndpoint: "node0:29400", RunID: "job"}
	for _, tt := range []struct {
		name string
		edit func(*Request)
		want string
	}{
		{"ok", func(*Request) {}, ""},
		{"no nnodes", func(r *Request) { r.NNodes = "" }, "needs --nnodes"},
		{"no endpoint", func(r *Request) { r.RendezvousEndpoint = "" }, "needs --rdzv-endpoint"},
		{"no id", func(r *Request) { r.RunID = "" }, "needs --rdzv-id"},
		{"hostfile", func(r *Request) { r.Hostfile = "hosts" }, "takes no --hostfile"},
		{"rank too big", func(r *Request) { r.NodeRank = "3" }, `--node-rank "3": want auto or 0 to 2`},
		{"rank not a number", func(r *Request) { r.NodeRank = "x" }, `--node-rank "x"`},
		{"endpoint without port", func(r *Request) { r.RendezvousEndpoint = "node0" }, "want HOST:PORT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			_, _, _, err := r.CheckPerNode()
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("err %v, want %q", err, tt.want)
			}
		})
	}
}

// TestReadSecret: per-node mode refuses to run without a secret, or with
// a short one.
func TestReadSecret(t *testing.T) {
	for _, tt := range []struct {
		env, want string
	}{
		{"", "needs the job secret"},
		{"short", "want at least 16"},
		{"sixteen-bytes-ok", ""},
	} {
		r := Request{Getenv: func(k string) string {
			if k == SecretEnv {
				return tt.env
			}
			return ""
		}}
		s, err := r.readSecret(t.Context())
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s=%q: err %v, want %q", SecretEnv, tt.env, err, tt.want)
		}
		if err == nil && string(s) != tt.env {
			t.Errorf("secret %q, want %q", s, tt.env)
		}
	}
}

// TestStoreErr: a failed store request of a round reads the same however
// far the node got into the round: a stop as its cause alone (CI once
// saw Ctrl-C during the member write reported with the store's key); a
// round that did not fill, and a refused secret, with what to do.
func TestStoreErr(t *testing.T) {
	pn := &perNode{endpoint: "127.0.0.1:29400", min: 2, max: 3}
	sigint := &InterruptedError{Signal: syscall.SIGINT}
	stopped, stop := context.WithCancelCause(t.Context())
	stop(sigint)
	late, cancel := context.WithTimeout(t.Context(), 0)
	defer cancel()
	<-late.Done()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"interrupted writing", stopped, fmt.Errorf(`rendezvous: set "pernode/0/member/1": %w`, sigint),
			`^launch: round 0 at 127\.0\.0\.1:29400: interrupted by SIGINT$`},
		{"interrupted waiting", stopped, sigint, `^launch: round 0 at 127\.0\.0\.1:29400: interrupted by SIGINT$`},
		{"timed out", late, context.DeadlineExceeded,
			`^launch: round 0 at 127\.0\.0\.1:29400: not enough nodes joined within 1m0s \(--nnodes 2:3\): .*raise --join-timeout$`},
		{"refused", t.Context(), fmt.Errorf("rendezvous: add: %w", rendezvous.ErrAuth),
			`^launch: round 0 at 127\.0\.0\.1:29400: rendezvous: add: .*\(every node must have the same --rdzv-secret-file or GTRAIN_RDZV_SECRET\)$`},
		{"store gone", t.Context(), errors.New("rendezvous: connection reset"), `^launch: round 0 at 127\.0\.0\.1:29400: rendezvous: connection reset$`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := pn.storeErr(tt.ctx, 0, tt.err, time.Minute)
			if !regexp.MustCompile(tt.want).MatchString(got.Error()) {
				t.Errorf("storeErr = %q, want it to match %q", got, tt.want)
			}
			if tt.ctx == stopped && !errors.Is(got, sigint) {
				t.Errorf("storeErr = %v does not wrap the interruption (its exit code)", got)
			}
		})
	}
}

package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/proctest"
	"github.com/gtrain/gtrain/launch/proto"
)

// The test binary doubles as `gtrain agent` when GTRAIN_TEST_AGENT=1, so the
// local transport runs the real agent code in a real child process.
func TestMain(m *testing.M) {
	if os.Getenv("GTRAIN_TEST_AGENT") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		err := RunAgent(ctx, os.Stdin, os.Stdout, "test")
		stop()
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	// The agents' directories (tests kill agents) go with the run.
	tmp, err := proctest.PrivateTMPDIR("gtrain-launch-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "launch_test:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// recorder is a status.View that keeps every event; on, if set, sees
// each one as it arrives.
type recorder struct {
	mu     sync.Mutex
	events []proto.Event
	on     func(proto.Event)
}

func (r *recorder) Event(ev proto.Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	if r.on != nil {
		r.on(ev)
	}
}

func (r *recorder) Close() error { return nil }

func (r *recorder) ofType(typ string) []proto.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []proto.Event
	for _, ev := range r.events {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// lines returns rank's output lines.
func (r *recorder) lines(rank int) []string {
	var out []string
	for _, ev := range r.ofType(proto.EventLog) {
		if ev.Rank == rank {
			out = append(out, ev.Line)
		}
	}
	return out
}

// localNodes is this machine with n slots.
func localNodes(n int) []hostfiles.Node {
	slots := make([]int, n)
	for i := range slots {
		slots[i] = i
	}
	return []hostfiles.Node{{Host: hostfiles.Host{Name: "localhost", Slots: n}, SlotIDs: slots}}
}

// runJob runs script under sh as every rank of an n-rank local job.
func runJob(t *testing.T, ctx context.Context, n int, grace time.Duration, script string) (*recorder, error) {
	t.Helper()
	return runJobWith(t, ctx, n, grace, nil, &recorder{}, script)
}

// runJobWith is runJob with env for every rank, reporting to rec.
func runJobWith(t *testing.T, ctx context.Context, n int, grace time.Duration, env []string, rec *recorder, script string) (*recorder, error) {
	t.Helper()
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	p, err := NewJob(JobOptions{Nodes: localNodes(n), Command: []string{"sh", "-c", script}, Grace: grace, Heartbeat: time.Second, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	tr := &Local{Exe: os.Args[0]}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, p, Runtime{Transport: tr, View: rec, AgentGrace: 5 * time.Second}) }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("job did not finish within 60s")
	}
	return rec, err
}

// pidsIn parses "pid=N" markers out of output lines.
func pidsIn(lines []string) []int {
	var out []int
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "pid="); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

func TestRunSuccess(t *testing.T) {
	rec, err := runJob(t, t.Context(), 3, time.Second, `echo "hello $RANK/$WORLD_SIZE"; printf "no newline"`)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := len(rec.ofType(proto.EventRankStarted)); got != 3 {
		t.Errorf("rank_started events = %d, want 3", got)
	}
	exits := rec.ofType(proto.EventRankExited)
	if len(exits) != 3 {
		t.Errorf("rank_exited events = %d, want 3", len(exits))
	}
	for _, ev := range exits {
		if ev.Code != 0 || ev.Killed {
			t.Errorf("rank %d exited code=%d killed=%v, want 0", ev.Rank, ev.Code, ev.Killed)
		}
	}
	for r := range 3 {
		want := []string{"hello " + strconv.Itoa(r) + "/3", "no newline"}
		if got := rec.lines(r); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("rank %d lines = %q, want %q", r, got, want)
		}
	}
	var partial int
	for _, ev := range rec.ofType(proto.EventLog) {
		if ev.Partial {
			partial++
		}
	}
	if partial != 3 {
		t.Errorf("partial log lines = %d, want 3 (one per rank)", partial)
	}
	if got := len(rec.ofType(proto.EventDone)); got != 1 {
		t.Errorf("done events = %d, want 1", got)
	}
}

// TestRunFailureTearsDown: the first rank to fail stops every other rank and
// everything they spawned, and its code, output and host are reported.
// Rank 2 fails once ranks 0 and 1 have announced their pids (files in
// $DIR), so that there is something to tear down whatever the load.
func TestRunFailureTearsDown(t *testing.T) {
	script := `if [ "$RANK" = 2 ]; then until [ -e "$DIR/0" ] && [ -e "$DIR/1" ]; do sleep 0.01; done; echo "bad things" >&2; exit 5; fi
sleep 300 & echo "pid=$!"; echo "pid=$$"; : > "$DIR/$RANK"; wait`
	rec, err := runJobWith(t, t.Context(), 3, 2*time.Second, []string{"DIR=" + t.TempDir()}, &recorder{}, script)
	var rf *RankFailedError
	if !errors.As(err, &rf) {
		t.Fatalf("Run error = %v, want *RankFailedError", err)
	}
	if rf.Rank != 2 || rf.Code != 5 || rf.Host != "localhost" {
		t.Errorf("failure = rank %d code %d host %q, want rank 2 code 5 host localhost", rf.Rank, rf.Code, rf.Host)
	}
	if len(rf.LastLines) == 0 || rf.LastLines[len(rf.LastLines)-1] != "bad things" {
		t.Errorf("last lines = %q, want to end with %q", rf.LastLines, "bad things")
	}
	var pids []int
	for r := range 2 {
		pids = append(pids, pidsIn(rec.lines(r))...)
	}
	if len(pids) != 4 {
		t.Fatalf("got pids %v from ranks 0 and 1, want 4 (rank and its child each)", pids)
	}
	for _, pid := range pids {
		if proctest.Alive(pid) {
			t.Errorf("pid %d survived teardown", pid)
		}
	}
	exits := rec.ofType(proto.EventRankExited)
	if len(exits) != 3 {
		t.Errorf("rank_exited events = %d, want 3", len(exits))
	}
	for _, ev := range exits {
		if ev.Rank != 2 && !ev.Killed {
			t.Errorf("rank %d not marked killed by teardown: %+v", ev.Rank, ev)
		}
	}
}

// TestRunGraceThenKill: a rank that ignores SIGTERM is SIGKILLed after the
// grace period. Rank 1 fails once rank 0 ignores SIGTERM (a file says so).
func TestRunGraceThenKill(t *testing.T) {
	script := `if [ "$RANK" = 1 ]; then until [ -e "$DIR/trapped" ]; do sleep 0.01; done; exit 3; fi
trap '' TERM; : > "$DIR/trapped"; while :; do sleep 0.1; done`
	start := time.Now()
	rec, err := runJobWith(t, t.Context(), 2, 500*time.Millisecond, []string{"DIR=" + t.TempDir()}, &recorder{}, script)
	var rf *RankFailedError
	if !errors.As(err, &rf) || rf.Code != 3 {
		t.Fatalf("Run error = %v, want rank failure with code 3", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("teardown took %v", d)
	}
	var rank0 []proto.Event
	for _, ev := range rec.ofType(proto.EventRankExited) {
		if ev.Rank == 0 {
			rank0 = append(rank0, ev)
		}
	}
	if len(rank0) != 1 || rank0[0].Signal != "SIGKILL" || !rank0[0].Killed {
		t.Errorf("rank 0 exits = %+v, want one, by SIGKILL in teardown", rank0)
	}
}

// TestRunSweepsEscapedProcesses: a process that left its rank's process group
// (setsid) is still killed when the job ends. The rank ends only once the
// process has left (it writes a file after setsid), so that the group kill
// cannot be what ends it: the agent must say it swept it.
func TestRunSweepsEscapedProcesses(t *testing.T) {
	script := `setsid sh -c ': > "$DIR/escaped"; exec sleep 300' & echo "pid=$!"; until [ -e "$DIR/escaped" ]; do sleep 0.01; done`
	rec, err := runJobWith(t, t.Context(), 1, time.Second, []string{"DIR=" + t.TempDir()}, &recorder{}, script)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	pids := pidsIn(rec.lines(0))
	if len(pids) != 1 {
		t.Fatalf("pids = %v", pids)
	}
	if proctest.Alive(pids[0]) {
		t.Errorf("escaped pid %d survived the job", pids[0])
	}
	var swept bool
	for _, ev := range rec.ofType(proto.EventNotice) {
		swept = swept || strings.Contains(ev.Message, "outlived their rank")
	}
	if !swept {
		t.Error("the agent did not report sweeping the escaped process")
	}
}

// TestRunInterrupted: an interrupt once both ranks run (they have printed
// their pids) ends them, and Run reports the interrupt.
func TestRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	var mu sync.Mutex
	seen := 0
	rec := &recorder{on: func(ev proto.Event) {
		if ev.Type != proto.EventLog || len(pidsIn([]string{ev.Line})) == 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if seen++; seen == 2 {
			cancel(&InterruptedError{Signal: syscall.SIGINT})
		}
	}}
	_, err := runJobWith(t, ctx, 2, time.Second, nil, rec, `echo "pid=$$"; exec sleep 300`)
	var ie *InterruptedError
	if !errors.As(err, &ie) || ie.Code() != 130 {
		t.Fatalf("Run error = %v, want *InterruptedError with code 130", err)
	}
	for r := range 2 {
		pids := pidsIn(rec.lines(r))
		if len(pids) != 1 {
			t.Fatalf("rank %d pids = %v, want its own", r, pids)
		}
		if proctest.Alive(pids[0]) {
			t.Errorf("rank %d pid %d survived the interrupt", r, pids[0])
		}
	}
}

func TestRunCommandNotFound(t *testing.T) {
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	p, err := NewJob(JobOptions{Nodes: localNodes(2), Command: []string{"/nonexistent/gtrain-no-such-cmd"}, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	err = Run(t.Context(), p, Runtime{Transport: &Local{Exe: os.Args[0]}, View: rec})
	var rf *RankFailedError
	if !errors.As(err, &rf) || rf.Code != 127 {
		t.Fatalf("Run error = %v, want rank failure with code 127", err)
	}
	if !strings.Contains(err.Error(), "could not start") {
		t.Errorf("error %q does not say the rank could not start", err)
	}
}

func TestRunStatusChannel(t *testing.T) {
	script := `echo '{"step":3,"loss":1.5}' >&$GTRAIN_STATUS_FD; echo 'not json' >&3`
	rec, err := runJob(t, t.Context(), 1, time.Second, script)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := rec.ofType(proto.EventStatus)
	if len(st) != 1 || string(st[0].Status) != `{"step":3,"loss":1.5}` {
		t.Errorf("status events = %+v, want one with the record", st)
	}
	var warned bool
	for _, ev := range rec.ofType(proto.EventNotice) {
		warned = warned || strings.Contains(ev.Message, "not a JSON object")
	}
	if !warned {
		t.Error("malformed status record was not reported")
	}
}

// TestRunStatusOversized: a status record over the line limit is dropped
// with a notice naming the rank and its size, and the records after it
// still arrive.
func TestRunStatusOversized(t *testing.T) {
	script := `{ printf '{"pad":"'; head -c 102400 /dev/zero | tr '\0' x; printf '"}\n'; echo '{"step":4}'; } >&3`
	rec, err := runJob(t, t.Context(), 1, time.Second, script)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := rec.ofType(proto.EventStatus)
	if len(st) != 1 || string(st[0].Status) != `{"step":4}` {
		t.Errorf("status events = %+v, want only the record after the oversized one", st)
	}
	var notices []string
	for _, ev := range rec.ofType(proto.EventNotice) {
		if strings.Contains(ev.Message, "status record of") {
			notices = append(notices, ev.Message)
		}
	}
	if len(notices) != 1 || !strings.Contains(notices[0], "rank 0") || !strings.Contains(notices[0], "102410 bytes") {
		t.Errorf("notices about the oversized record = %q, want one naming rank 0 and 102410 bytes", notices)
	}
}

func TestRunRestarts(t *testing.T) {
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	p, err := NewJob(JobOptions{Nodes: localNodes(2), MaxRestarts: 2, Grace: time.Second,
		Command: []string{"sh", "-c", `[ "$TORCHELASTIC_RESTART_COUNT" = 2 ] || exit 4; echo "attempt $GTRAIN_ATTEMPT"`}})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	if err := Run(t.Context(), p, Runtime{Transport: &Local{Exe: os.Args[0]}, View: rec}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := rec.lines(0); len(got) != 1 || got[0] != "attempt 2" {
		t.Errorf("rank 0 lines = %q, want [attempt 2]", got)
	}
	if got := len(rec.ofType(proto.EventRankStarted)); got != 6 {
		t.Errorf("rank starts = %d, want 6 (2 ranks x 3 attempts)", got)
	}
}

// TestRunFloodKeepsAgentsAlive: real agents with a short heartbeat, one
// rank flooding its output faster than a slow view shows it, so the other
// agent's heartbeats wait behind the flood in the launcher's queue longer
// than the silence limit; the job must not be declared lost. The quiet
// rank runs until the view has shown the whole flood (it waits for a file
// the view writes then).
func TestRunFloodKeepsAgentsAlive(t *testing.T) {
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	done := filepath.Join(t.TempDir(), "shown")
	const lines, delay = 80, 80 * time.Millisecond
	script := `if [ "$RANK" = 0 ]; then yes flood | head -n ` + strconv.Itoa(lines) + `; exit 0; fi
until [ -e "$DONE" ]; do sleep 0.05; done`
	nodes := []hostfiles.Node{
		{Host: hostfiles.Host{Name: "localhost", Slots: 1}, SlotIDs: []int{0}},
		{Host: hostfiles.Host{Name: "127.0.0.1", Slots: 1}, SlotIDs: []int{0}},
	}
	p, err := NewJob(JobOptions{Nodes: nodes, Command: []string{"sh", "-c", script}, Grace: time.Second,
		Heartbeat: 100 * time.Millisecond, Env: []string{"DONE=" + done}})
	if err != nil {
		t.Fatal(err)
	}
	if limit := SilentAfter(p.Heartbeat); 64*delay <= limit {
		t.Fatalf("queue delay %v does not exceed the silence limit %v: the test checks nothing", 64*delay, limit)
	}
	view := &slowView{delay: delay, shown: func(n int) {
		if n == lines {
			_ = os.WriteFile(done, nil, 0o600)
		}
	}}
	if err := Run(t.Context(), p, Runtime{Transport: &Local{Exe: os.Args[0]}, View: view, AgentGrace: 5 * time.Second}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := len(view.lines(0)); got != lines {
		t.Errorf("rank 0 lines = %d, want %d", got, lines)
	}
}

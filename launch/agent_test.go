package launch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/proctest"
	"github.com/gtrain/gtrain/launch/proto"
)

// TestAgentStdinEOF: when the launcher disappears (the agent's stdin closes),
// the agent tears its ranks down and exits on its own.
func TestAgentStdinEOF(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GTRAIN_TEST_AGENT=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	asg := &proto.Assignment{V: proto.Version, RunID: "eof", Host: "localhost", GraceMillis: 1000,
		Command: []string{"sh", "-c", `echo "pid=$$"; exec sleep 300`},
		Ranks:   []proto.RankAssignment{{Rank: 0}, {Rank: 1, LocalRank: 1}}}
	if err := proto.NewEncoder(stdin).Encode(asg); err != nil {
		t.Fatal(err)
	}
	dec := proto.NewDecoder(stdout)
	var pids []int
	types := map[string]int{}
	closed := false
	deadline := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer deadline.Stop()
	for {
		var ev proto.Event
		if err := dec.Decode(&ev); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		types[ev.Type]++
		if ev.Type == proto.EventLog {
			pids = append(pids, pidsIn([]string{ev.Line})...)
		}
		if len(pids) == 2 && !closed {
			closed = true
			stdin.Close() // the launcher is gone
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("agent exit: %v", err)
	}
	if types[proto.EventJoined] != 1 || types[proto.EventRankExited] != 2 || types[proto.EventDone] != 1 {
		t.Errorf("event counts = %v, want joined 1, rank_exited 2, done 1", types)
	}
	if len(pids) != 2 {
		t.Fatalf("rank pids = %v, want 2", pids)
	}
	for _, pid := range pids {
		if proctest.Alive(pid) {
			t.Errorf("rank pid %d survived stdin EOF", pid)
		}
	}
}

func TestAgentBadSpec(t *testing.T) {
	tests := []struct{ name, asg, want string }{
		{"no command", `{"v":1,"ranks":[{"rank":0}]}`, "no command"},
		{"no ranks", `{"v":1,"command":["true"]}`, "no ranks"},
		{"wrong version", `{"v":9,"command":["true"]}`, "protocol version 9"},
		{"empty input", ``, "EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			err := RunAgent(t.Context(), strings.NewReader(tt.asg), &out, "test")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("RunAgent error = %v, want %q", err, tt.want)
			}
			if !strings.Contains(out.String(), `"type":"error"`) {
				t.Errorf("no error event written: %s", out.String())
			}
		})
	}
}

// TestRunUnwritableTmpdir: an agent whose TMPDIR cannot be written (here a
// path under a regular file, which not even root can create) fails the job
// before any rank starts, naming the host and the path and saying to set
// TMPDIR, instead of starting ranks that cannot reach the job's store.
func TestRunUnwritableTmpdir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(file, "tmp")
	t.Setenv("TMPDIR", bad)
	rec, err := runJob(t, t.Context(), 2, time.Second, `echo started`)
	var lost *AgentLostError
	if !errors.As(err, &lost) {
		t.Fatalf("Run error = %v, want *AgentLostError", err)
	}
	for _, want := range []string{"host localhost", bad, "set TMPDIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if got := rec.ofType(proto.EventRankStarted); len(got) != 0 {
		t.Errorf("ranks started despite the unwritable TMPDIR: %+v", got)
	}
}

// gateWriter blocks every Write until open is closed; entered hears of the
// first Write.
type gateWriter struct {
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.once.Do(func() { close(g.entered) })
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

// TestEventWriterHeartbeatFirst: while the launcher reads slowly (a write
// blocks) and a rank's output fills the agent's queue, a heartbeat neither
// blocks its sender nor waits behind the queued lines: it is written next.
// Every other event keeps its order.
func TestEventWriterHeartbeatFirst(t *testing.T) {
	g := &gateWriter{entered: make(chan struct{}), open: make(chan struct{})}
	w := newEventWriter(proto.NewEncoder(g))
	line := func(i int) proto.Event {
		return proto.Event{V: proto.Version, Type: proto.EventLog, Line: strconv.Itoa(i)}
	}
	w.send(line(0))
	<-g.entered // the writer is stuck writing line 0
	for i := 1; i <= eventQueue; i++ {
		w.send(line(i)) // fills the queue without blocking
	}
	sent := make(chan struct{})
	go func() {
		w.send(proto.Event{V: proto.Version, Type: proto.EventHeartbeat})
		close(sent)
	}()
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("sending a heartbeat blocked behind the queued output")
	}
	close(g.open)
	w.close()
	dec := proto.NewDecoder(&g.buf)
	var got []string
	for {
		var ev proto.Event
		if err := dec.Decode(&ev); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		got = append(got, ev.Type+":"+ev.Line)
	}
	want := []string{"log:0", "heartbeat:"}
	for i := 1; i <= eventQueue; i++ {
		want = append(want, "log:"+strconv.Itoa(i))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events written = %v\nwant %v", got, want)
	}
}

// TestAgentBeatsWhilePreparing: the agent beats from the moment it has
// its assignment, while it detects its host (here held until three beats
// have arrived), not only once it has joined: a slow detection on a
// loaded host must not look like a dead agent to the launcher.
func TestAgentBeatsWhilePreparing(t *testing.T) {
	release := make(chan struct{})
	detect := DetectHost
	DetectHost = func(ctx context.Context) *hostinfo.Host {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		return detect(ctx)
	}
	t.Cleanup(func() { DetectHost = detect })
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		errc <- RunAgent(t.Context(), inR, outW, "test")
		outW.Close()
	}()
	asg := &proto.Assignment{V: proto.Version, RunID: "beat", Host: "localhost", GraceMillis: 1000, BeatMillis: 20,
		Command: []string{"true"}, Ranks: []proto.RankAssignment{{Rank: 0}}}
	go func() { _ = proto.NewEncoder(inW).Encode(asg) }()
	dec := proto.NewDecoder(outR)
	beats, joined := 0, false
	for {
		var ev proto.Event
		if err := dec.Decode(&ev); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		switch ev.Type {
		case proto.EventHeartbeat:
			if beats++; beats == 3 && !joined {
				close(release)
			}
		case proto.EventJoined:
			joined = true
			if beats < 3 {
				t.Errorf("joined after %d heartbeats, though detection was held until 3", beats)
			}
		case proto.EventDone:
			inW.Close()
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("RunAgent: %v", err)
	}
	if !joined {
		t.Fatalf("the agent never joined (%d heartbeats)", beats)
	}
}

package status

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/launch/proto"
)

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// countWriter records each Write call separately.
type countWriter struct{ writes []string }

func (w *countWriter) Write(b []byte) (int, error) {
	w.writes = append(w.writes, string(b))
	return len(b), nil
}

func TestLines(t *testing.T) {
	part := logLine(3, "stdout", "no newline")
	part.Partial = true
	remote := logLine(3, "stderr", "boom")
	remote.Host = "worker-1"
	tests := []struct {
		name       string
		multiHost  bool
		events     []proto.Event
		out, errs  string
		stdoutCall int // Write calls on stdout
	}{
		{"stdout prefixed", false, []proto.Event{logLine(3, "stdout", "hello")}, "[rank 3] hello\n", "", 1},
		{"stderr routed", false, []proto.Event{logLine(3, "stderr", "warn")}, "", "[rank 3] warn\n", 0},
		{"partial gets newline", false, []proto.Event{part, logLine(3, "stdout", "next")},
			"[rank 3] no newline\n[rank 3] next\n", "", 2},
		{"empty line", false, []proto.Event{logLine(0, "stdout", "")}, "[rank 0] \n", "", 1},
		{"multi-host prefix", true, []proto.Event{remote}, "", "[worker-1:3] boom\n", 0},
		{"notice to stderr", false, []proto.Event{{Type: proto.EventNotice, Rank: -1, Message: "rank 3 failed"}},
			"", "gtrain: rank 3 failed\n", 0},
		{"other events silent", false, []proto.Event{
			started(0, 1, 0), statusEv(0, `{"step":1}`), exited(0, 1, "", false, 1),
			node(proto.EventJoined), node(proto.EventHeartbeat), node(proto.EventError),
			node(proto.EventDone), node(proto.EventJobExited),
		}, "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out countWriter
			var errs bytes.Buffer
			v := NewLines(&out, &errs, tt.multiHost)
			for _, ev := range tt.events {
				v.Event(ev)
			}
			if err := v.Close(); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(out.writes, ""); got != tt.out {
				t.Errorf("stdout = %q, want %q", got, tt.out)
			}
			if len(out.writes) != tt.stdoutCall {
				t.Errorf("stdout got %d writes, want one per line (%d)", len(out.writes), tt.stdoutCall)
			}
			if errs.String() != tt.errs {
				t.Errorf("stderr = %q, want %q", errs.String(), tt.errs)
			}
		})
	}
}

func TestLinesWriteError(t *testing.T) {
	v := NewLines(failWriter{}, io.Discard, false)
	v.Event(logLine(0, "stdout", "x"))
	if err := v.Close(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Close() = %v, want the write error", err)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	events := []proto.Event{
		started(0, 42, 0),
		logLine(0, "stdout", `quotes " and <html> & unicode é`),
		statusEv(0, `{"step":1,"loss":2.5}`),
		exited(0, 143, "SIGTERM", true, 3),
		{Type: proto.EventNotice, Time: t0, Rank: -1, Message: "stopping"}, // launcher event: no version
		{V: 1, Type: proto.EventJoined, Time: t0, Host: "w0", Rank: -1,
			Facts: &proto.HostFacts{Hostname: "w0", OS: "linux", Arch: "amd64", CPUs: 8, PID: 9, Version: "dev"}},
	}
	var buf bytes.Buffer
	v := NewJSON(&buf)
	for _, ev := range events {
		v.Event(ev)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "\n"); n != len(events) {
		t.Fatalf("%d lines, want %d:\n%s", n, len(events), buf.String())
	}
	dec := proto.NewDecoder(&buf)
	for i, want := range events {
		want.V = proto.Version
		var got proto.Event
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d =\n%+v\nwant\n%+v", i, got, want)
		}
	}
	var extra proto.Event
	if err := dec.Decode(&extra); err != io.EOF {
		t.Errorf("after last event: %v, want EOF", err)
	}
}

func TestJSONWriteError(t *testing.T) {
	v := NewJSON(failWriter{})
	v.Event(node(proto.EventDone))
	if err := v.Close(); err == nil {
		t.Error("Close() = nil, want the write error")
	}
}

// modelView is a View that applies every event to a model, so that a
// test can see what a view received.
type modelView struct{ m *Model }

func (v modelView) Event(ev proto.Event) { v.m.Apply(ev) }
func (v modelView) Close() error         { return nil }

func TestMulti(t *testing.T) {
	m1, m2 := NewModel(nil), NewModel(nil)
	v := Multi(modelView{m1}, nil, NewJSON(failWriter{}), modelView{m2})
	v.Event(started(5, 1, 0))
	for i, m := range []*Model{m1, m2} {
		if r := m.Ranks(); len(r) != 1 || r[0].State != Running {
			t.Errorf("view %d did not get the event: %+v", i, r)
		}
	}
	if err := v.Close(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Close() = %v, want the JSON view's error", err)
	}
}

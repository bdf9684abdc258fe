package status

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// at returns t0 plus sec seconds.
func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

func started(rank, pid int, sec int) proto.Event {
	return proto.Event{V: 1, Type: proto.EventRankStarted, Time: at(sec), Host: "w0", Rank: rank, PID: pid}
}

func logLine(rank int, stream, line string) proto.Event {
	return proto.Event{V: 1, Type: proto.EventLog, Time: t0, Host: "w0", Rank: rank, Stream: stream, Line: line}
}

func statusEv(rank int, rec string) proto.Event {
	return proto.Event{V: 1, Type: proto.EventStatus, Time: t0, Host: "w0", Rank: rank, Status: json.RawMessage(rec)}
}

func exited(rank, code int, sig string, killed bool, sec int) proto.Event {
	return proto.Event{V: 1, Type: proto.EventRankExited, Time: at(sec), Host: "w0", Rank: rank,
		Code: code, Signal: sig, Killed: killed}
}

func node(typ string) proto.Event {
	return proto.Event{V: 1, Type: typ, Time: t0, Host: "w0", Rank: -1, Message: "m"}
}

func ptr[T any](v T) *T { return &v }

func TestStateString(t *testing.T) {
	want := map[State]string{Pending: "pending", Running: "running", Exited: "exited",
		Failed: "failed", Stopped: "stopped", State(99): "unknown"}
	for s, w := range want {
		if got := s.String(); got != w {
			t.Errorf("State(%d).String() = %q, want %q", int(s), got, w)
		}
	}
}

func TestModelApply(t *testing.T) {
	info := RankInfo{Rank: 0, LocalRank: 0, Node: 0, Host: "w0"}
	running := RankState{RankInfo: info, State: Running, PID: 42, Started: t0}
	with := func(f func(*RankState)) RankState { r := running; f(&r); return r }
	tests := []struct {
		name   string
		events []proto.Event
		want   RankState
	}{
		{"no events", nil, RankState{RankInfo: info}},
		{"rank_started", []proto.Event{started(0, 42, 0)}, running},
		{"node events change nothing", []proto.Event{
			node(proto.EventJoined), node(proto.EventHeartbeat), node(proto.EventDone),
			node(proto.EventNotice), node(proto.EventJobExited), node(proto.EventError),
		}, RankState{RankInfo: info}},
		{"rank event of unknown type", []proto.Event{started(0, 42, 0), {V: 1, Type: "future", Rank: 0, PID: 7}}, running},
		{"log sets last line", []proto.Event{started(0, 42, 0), logLine(0, "stdout", "a"), logLine(0, "stderr", "b")},
			with(func(r *RankState) { r.LastLine = "b" })},
		{"blank log keeps last line", []proto.Event{started(0, 42, 0), logLine(0, "stdout", "a"), logLine(0, "stdout", "  ")},
			with(func(r *RankState) { r.LastLine = "a" })},
		{"log is cleaned", []proto.Event{started(0, 42, 0), logLine(0, "stdout", "10%\r\x1b[32m20%\x1b[0m\tdone")},
			with(func(r *RankState) { r.LastLine = "20% done" })},
		{"status tokens", []proto.Event{started(0, 42, 0), statusEv(0, `{"step":120,"loss":2.5,"tokens_per_s":12345,"lr":0.001}`)},
			with(func(r *RankState) {
				r.Step, r.Loss, r.LR, r.Throughput = ptr[int64](120), ptr(2.5), ptr(0.001), "12.3k tok/s"
				r.TokensPerS, r.Losses = ptr(12345.0), []float64{2.5}
			})},
		{"status not finite", []proto.Event{started(0, 42, 0), statusEv(0, `{"step":7,"loss":"Infinity","lr":"-inf","tokens_per_s":"Infinity","non_finite":true}`)},
			with(func(r *RankState) {
				r.Step, r.Loss, r.LR, r.Throughput = ptr[int64](7), ptr(math.Inf(1)), ptr(math.Inf(-1)), "+Inf tok/s"
				r.TokensPerS, r.Losses = ptr(math.Inf(1)), []float64{math.Inf(1)}
			})},
		{"status samples", []proto.Event{started(0, 42, 0), statusEv(0, `{"samples_per_s":45}`)},
			with(func(r *RankState) { r.Throughput = "45.0 samples/s" })},
		{"status merges", []proto.Event{started(0, 42, 0), statusEv(0, `{"step":1,"loss":3}`), statusEv(0, `{"step":2.0}`)},
			with(func(r *RankState) { r.Step, r.Loss, r.Losses = ptr[int64](2), ptr(3.0), []float64{3} })},
		{"engine record", []proto.Event{started(0, 42, 0), statusEv(0, `{"step":4,"loss":3,"val_loss":3.5,"step_ms":120.5,"comm_wait_ms":20,`+
			`"memory":{"params":10,"grads":10,"optimizer":20,"activations":5,"buffers":1,"total":46},"coord":{"dp":1,"pp":0,"tp":1}}`),
			statusEv(0, `{"step":5,"loss":2}`)},
			with(func(r *RankState) {
				r.Step, r.Loss, r.ValLoss, r.StepMillis, r.WaitMillis = ptr[int64](5), ptr(2.0), ptr(3.5), ptr(120.5), ptr(20.0)
				r.Memory = &Memory{Params: 10, Grads: 10, Optimizer: 20, Activations: 5, Buffers: 1, Total: 46}
				r.Coord, r.Losses = &Coord{DP: 1, TP: 1}, []float64{3, 2}
			})},
		{"malformed status ignored", []proto.Event{started(0, 42, 0), statusEv(0, `{"step":1}`),
			statusEv(0, `not json`), statusEv(0, `[1]`), statusEv(0, `{"step":"x"}`), statusEv(0, `{"step":1.5,"loss":9}`),
			statusEv(0, `{"loss":"high"}`), statusEv(0, ``), statusEv(0, `null`)},
			with(func(r *RankState) { r.Step = ptr[int64](1) })},
		{"exit 0", []proto.Event{started(0, 42, 0), exited(0, 0, "", false, 5)},
			with(func(r *RankState) { r.State, r.Ended = Exited, at(5) })},
		{"exit code", []proto.Event{started(0, 42, 0), {V: 1, Type: proto.EventRankExited, Time: at(5), Rank: 0, Code: 3, Message: "oom"}},
			with(func(r *RankState) { r.State, r.Ended, r.Code, r.Message = Failed, at(5), 3, "oom" })},
		{"signal not ours", []proto.Event{started(0, 42, 0), exited(0, 137, "SIGKILL", false, 5)},
			with(func(r *RankState) { r.State, r.Ended, r.Code, r.Signal = Failed, at(5), 137, "SIGKILL" })},
		{"killed by teardown", []proto.Event{started(0, 42, 0), exited(0, 143, "SIGTERM", true, 5)},
			with(func(r *RankState) { r.State, r.Ended, r.Code, r.Signal = Stopped, at(5), 143, "SIGTERM" })},
		{"killed but exited 0", []proto.Event{started(0, 42, 0), exited(0, 0, "", true, 5)},
			with(func(r *RankState) { r.State, r.Ended = Stopped, at(5) })},
		{"error before start", []proto.Event{{V: 1, Type: proto.EventError, Time: at(1), Rank: 0, Message: "exec: not found"}},
			RankState{RankInfo: info, State: Failed, Ended: at(1), Message: "exec: not found"}},
		{"error while running", []proto.Event{started(0, 42, 0), {V: 1, Type: proto.EventError, Time: at(1), Rank: 0, Message: "x"}},
			running},
		{"restart resets", []proto.Event{started(0, 1, 0), statusEv(0, `{"step":9}`), exited(0, 1, "", false, 1), started(0, 42, 0)},
			running},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewModel([]RankInfo{info, {Rank: 1, Host: "w0"}})
			for _, ev := range tt.events {
				m.Apply(ev)
			}
			got := m.Ranks()
			if len(got) != 2 {
				t.Fatalf("Ranks() has %d ranks, want 2", len(got))
			}
			if !reflect.DeepEqual(got[0], tt.want) {
				t.Errorf("rank 0 =\n%+v\nwant\n%+v", got[0], tt.want)
			}
			if want := (RankState{RankInfo: RankInfo{Rank: 1, Host: "w0"}}); !reflect.DeepEqual(got[1], want) {
				t.Errorf("rank 1 changed: %+v", got[1])
			}
		})
	}
}

// TestStatusNaN: a loss that became NaN, written as the string "NaN"
// (JSON has no NaN), shows as NaN in the table rather than being dropped
// with the whole record.
func TestStatusNaN(t *testing.T) {
	m := NewModel([]RankInfo{{Rank: 0, Host: "w0"}})
	m.Apply(started(0, 42, 0))
	m.Apply(statusEv(0, `{"step":9,"loss":"NaN","grad_norm":"NaN","tokens_per_s":1000,"non_finite":true}`))
	r := m.Ranks()[0]
	if r.Step == nil || *r.Step != 9 || r.Loss == nil || !math.IsNaN(*r.Loss) {
		t.Fatalf("after a NaN record: step %v, loss %v; want step 9, loss NaN", r.Step, r.Loss)
	}
	if cells := rowCells(r, time.Time{}); cells[6] != "NaN" {
		t.Errorf("loss cell %q, want NaN (row %q)", cells[6], cells)
	}
}

func TestModelRanks(t *testing.T) {
	t.Run("ordered by rank", func(t *testing.T) {
		m := NewModel([]RankInfo{{Rank: 2}, {Rank: 0}, {Rank: 1}})
		for i, r := range m.Ranks() {
			if r.Rank != i {
				t.Fatalf("Ranks()[%d].Rank = %d", i, r.Rank)
			}
		}
	})
	t.Run("unknown rank is added in order", func(t *testing.T) {
		m := NewModel([]RankInfo{{Rank: 0}, {Rank: 4}})
		m.Apply(proto.Event{Type: proto.EventRankStarted, Time: t0, Host: "w9", Node: 3, Rank: 2, Local: 1, PID: 5})
		got := m.Ranks()
		if len(got) != 3 || got[1].RankInfo != (RankInfo{Rank: 2, LocalRank: 1, Node: 3, Host: "w9"}) || got[1].State != Running {
			t.Errorf("Ranks() = %+v", got)
		}
	})
	t.Run("snapshot is a copy", func(t *testing.T) {
		m := NewModel([]RankInfo{{Rank: 0}})
		snap := m.Ranks()
		m.Apply(started(0, 1, 0))
		if snap[0].State != Pending {
			t.Errorf("snapshot changed to %v", snap[0].State)
		}
	})
	t.Run("zero event time is now", func(t *testing.T) {
		m := NewModel([]RankInfo{{Rank: 0}})
		before := time.Now()
		m.Apply(proto.Event{Type: proto.EventRankStarted, Rank: 0})
		if s := m.Ranks()[0].Started; s.Before(before) {
			t.Errorf("Started = %v, want >= %v", s, before)
		}
	})
}

func TestModelApplyStarted(t *testing.T) {
	m := NewModel([]RankInfo{{Rank: 0}})
	m.Apply(started(0, 7, 0))
	if r := m.Ranks()[0]; r.State != Running || r.PID != 7 {
		t.Errorf("rank = %+v, want running pid 7", r)
	}
}

// TestModelStraggler: a straggler event marks the rank ("running (slow)"
// in the table), its end takes the mark away, and an ended rank shows its
// end, not the mark.
func TestModelStraggler(t *testing.T) {
	m := NewModel([]RankInfo{{Rank: 0, Host: "w0"}})
	m.Apply(started(0, 42, 0))
	m.Apply(proto.Event{V: 1, Type: proto.EventStraggler, Time: t0, Host: "w0", Rank: 0, Message: "2.0× the median"})
	r := m.Ranks()[0]
	if r.Straggler != "2.0× the median" || stateCell(r) != "running (slow)" {
		t.Errorf("marked: straggler %q, state cell %q", r.Straggler, stateCell(r))
	}
	m.Apply(proto.Event{V: 1, Type: proto.EventStragglerEnd, Time: t0, Host: "w0", Rank: 0})
	if r := m.Ranks()[0]; r.Straggler != "" || stateCell(r) != "running" {
		t.Errorf("unmarked: straggler %q, state cell %q", r.Straggler, stateCell(r))
	}
	m.Apply(proto.Event{V: 1, Type: proto.EventStraggler, Time: t0, Host: "w0", Rank: 0, Message: "slow"})
	m.Apply(exited(0, 1, "", false, 5))
	if got := stateCell(m.Ranks()[0]); got != "failed (1)" {
		t.Errorf("an ended straggler's state cell %q, want failed (1)", got)
	}
}

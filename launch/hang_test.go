package launch

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/usage"
)

// feed gives every rank of work[rank] its steps' work, round-robin by
// step as a job's records arrive, and returns every change.
func feed(s *stragglers, work [][]float64) []stragglerChange {
	var out []stragglerChange
	for i := range work[0] {
		for r := range work {
			out = append(out, s.observe(r, work[r][i])...)
		}
	}
	return out
}

// steady is n steps of about ms each, jittered by ±10%.
func steady(n int, ms float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = ms * (1 + 0.1*float64(i%3-1))
	}
	return out
}

func TestStragglers(t *testing.T) {
	t.Run("a uniform job is not marked", func(t *testing.T) {
		s := newStragglers(1.5, 4)
		if ch := feed(s, [][]float64{steady(40, 100), steady(40, 110), steady(40, 95), steady(40, 120)}); len(ch) != 0 {
			t.Errorf("changes %+v, want none", ch)
		}
		if len(s.summary()) != 0 {
			t.Errorf("summary %+v", s.summary())
		}
	})
	t.Run("a slowed rank is marked, once", func(t *testing.T) {
		s := newStragglers(1.5, 4)
		ch := feed(s, [][]float64{steady(40, 100), steady(40, 100), steady(40, 200), steady(40, 100)})
		if len(ch) != 1 || ch[0].rank != 2 || !strings.Contains(ch[0].why, "2.0× the job's median 100.0 ms") {
			t.Fatalf("changes %+v, want rank 2 marked once at 2.0×", ch)
		}
		if sum := s.summary(); len(sum) != 1 || sum[0].rank != 2 {
			t.Errorf("summary %+v, want rank 2", sum)
		}
	})
	t.Run("a rank that recovers is unmarked, and stays in the summary", func(t *testing.T) {
		s := newStragglers(1.5, 2)
		ch := feed(s, [][]float64{append(steady(10, 100), steady(10, 100)...), append(steady(10, 300), steady(10, 100)...)})
		if len(ch) != 2 || ch[0].rank != 1 || ch[0].why == "" || ch[1].rank != 1 || ch[1].why != "" {
			t.Fatalf("changes %+v, want rank 1 marked then unmarked", ch)
		}
		if len(s.summary()) != 1 {
			t.Errorf("summary %+v, want rank 1", s.summary())
		}
	})
	t.Run("nothing is judged before every rank has a window", func(t *testing.T) {
		s := newStragglers(1.5, 3) // rank 2 never reports
		if ch := feed(s, [][]float64{steady(40, 100), steady(40, 300)}); len(ch) != 0 {
			t.Errorf("changes %+v, want none", ch)
		}
	})
	t.Run("a few milliseconds more is noise", func(t *testing.T) {
		s := newStragglers(1.5, 2)
		if ch := feed(s, [][]float64{steady(40, 2), steady(40, 5)}); len(ch) != 0 {
			t.Errorf("changes %+v, want none", ch)
		}
	})
	t.Run("off", func(t *testing.T) {
		s := newStragglers(0, 2)
		if ch := feed(s, [][]float64{steady(40, 100), steady(40, 900)}); len(ch) != 0 {
			t.Errorf("changes %+v, want none", ch)
		}
	})
}

func step(n int64) rankStatus { return rankStatus{step: &n} }

func TestStepWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := newStepWatch(10 * time.Second)
	w.status(0, step(1), t0)
	w.status(1, step(1), t0)
	w.status(2, rankStatus{dumpSignal: "SIGUSR2"}, t0) // no step: not watched
	w.status(0, step(2), t0.Add(5*time.Second))
	if _, _, ok := w.stalled(t0.Add(9 * time.Second)); ok {
		t.Error("stalled before the timeout")
	}
	r, seen, ok := w.stalled(t0.Add(11 * time.Second))
	if !ok || r != 1 || seen.step != 1 {
		t.Errorf("stalled: rank %d step %d %v, want rank 1 at step 1", r, seen.step, ok)
	}
	w.status(1, step(1), t0.Add(12*time.Second)) // the same step again is no progress
	if r, _, _ := w.stalled(t0.Add(13 * time.Second)); r != 1 {
		t.Errorf("a repeated step reset the watch of rank 1 (stalled: %d)", r)
	}
	w.exited(1)
	if r, _, ok := w.stalled(t0.Add(16 * time.Second)); !ok || r != 0 {
		t.Errorf("after rank 1 exited: stalled %d %v, want rank 0", r, ok)
	}
	if !w.dumpable[2] || w.dumpable[0] {
		t.Errorf("dumpable %v, want rank 2 only", w.dumpable)
	}
	off := newStepWatch(0)
	off.status(0, step(1), t0)
	if _, _, ok := off.stalled(t0.Add(time.Hour)); ok {
		t.Error("a watch with no timeout fired")
	}
}

func TestParseStatus(t *testing.T) {
	st := parseStatus(json.RawMessage(`{"step":7,"step_ms":"NaN","comm_wait_ms":2.5,"dump_signal":"SIGUSR2","loss":1}`))
	if st.step == nil || *st.step != 7 || st.stepMillis != nil || st.waitMillis == nil || *st.waitMillis != 2.5 || st.dumpSignal != "SIGUSR2" {
		t.Errorf("parsed %+v", st)
	}
	if st := parseStatus(json.RawMessage(`[1]`)); st.step != nil {
		t.Errorf("an array parsed as %+v", st)
	}
}

func TestCheckWatch(t *testing.T) {
	for _, tc := range []struct {
		r    Request
		want string
	}{
		{Request{HangTimeout: -time.Second}, "--hang-timeout -1s"},
		{Request{StragglerFactor: 1}, "--straggler-factor 1:"},
		{Request{StragglerFactor: 5000}, "--straggler-factor 5000"},
		{Request{HangTimeout: time.Minute, StragglerFactor: 1.5}, ""},
		{Request{}, ""},
	} {
		err := tc.r.checkWatch()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.r, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, new(*usage.Error))):
			t.Errorf("%+v: %v, want a usage error with %q", tc.r, err, tc.want)
		}
	}
}

func TestHangErrorMessage(t *testing.T) {
	e := &HangError{Rank: 2, Host: "b", Blamed: true, Step: 12, Timeout: 3 * time.Second, Report: "ranks 0,1,3 wait in all_reduce #40\n", Dir: "/logs/x/attempt-1"}
	want := "launch: hang: no step for 3s after step 12; the ranks wait for rank 2 (host b); the flight records say:\nranks 0,1,3 wait in all_reduce #40\nflight records, goroutine stacks and this report: /logs/x/attempt-1"
	if e.Error() != want {
		t.Errorf("got\n%s\nwant\n%s", e.Error(), want)
	}
	if !restartable(e) {
		t.Error("a hang is not restartable")
	}
	if got := (&HangError{Rank: 0, Host: "a", Step: 3, Timeout: time.Minute}).Error(); !strings.HasPrefix(got, "launch: hang: rank 0 (host a) made no step after step 3 for 1m0s") || !strings.Contains(got, "run with --log-dir") {
		t.Errorf("without a log dir: %s", got)
	}
}

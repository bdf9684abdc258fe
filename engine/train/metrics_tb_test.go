package train

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/tfevents/tfeventstest"
)

// tbScalars is the scalars of events by step and tag, the later event of
// a step winning, after TensorBoard's rule for a restart: a SessionLog
// START at step s drops the events of steps s and after read before it.
func tbScalars(evs []tfeventstest.Event) map[int64]map[string]float32 {
	got := map[int64]map[string]float32{}
	for _, ev := range evs {
		if ev.What == "session_log" && ev.SessionStatus == "START" {
			for s := range got {
				if s >= ev.Step {
					delete(got, s)
				}
			}
		}
		for _, v := range ev.Values {
			if v.SimpleValue == nil {
				continue
			}
			if got[ev.Step] == nil {
				got[ev.Step] = map[string]float32{}
			}
			got[ev.Step][v.Tag] = *v.SimpleValue
		}
	}
	return got
}

// checkTBMatchesMetrics fails t unless the event files in dir hold, for
// every record of runDir's metrics.jsonl, its scalars under the
// SummaryWriter tags, and the job as text.
func checkTBMatchesMetrics(t *testing.T, tbDir, runDir string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(tbDir, "events.out.tfevents.*"))
	slices.Sort(files)
	if len(files) == 0 {
		t.Fatalf("no event file in %s", tbDir)
	}
	evs := tfeventstest.Read(t, files...)
	got := tbScalars(evs)
	lines := readMetricsFile(t, runDir)
	if len(lines) == 0 || len(got) != len(lines) {
		t.Fatalf("event files have scalars at %d steps, metrics.jsonl %d records", len(got), len(lines))
	}
	for _, m := range lines {
		for _, s := range Scalars(m) {
			if v, ok := got[int64(m.Step)][s.Tag]; !ok || v != s.Value {
				t.Errorf("step %d %s: TensorBoard %v (present %v), metrics.jsonl %v", m.Step, s.Tag, v, ok, s.Value)
			}
		}
	}
	if _, ok := got[int64(lines[len(lines)-1].Step)][TagValLoss]; !ok {
		t.Errorf("no %s at the last step", TagValLoss)
	}
	text := 0
	for _, ev := range evs {
		for _, v := range ev.Values {
			if v.Tag == TagJob && v.Plugin == "text" && len(v.Text) == 1 && strings.Contains(v.Text[0], `"preset": "test"`) {
				text++
			}
		}
	}
	if text != len(files) {
		t.Errorf("%d job text summaries in %d event files, want one each", text, len(files))
	}
}

// TestTensorBoardMatchesMetrics: log.tensorboard's event files, read by
// Python's protobuf, hold the scalars of metrics.jsonl at every step and
// the job as text, for a run and for a run stopped and resumed (a second
// event file that begins with a restart at the checkpoint's step).
func TestTensorBoardMatchesMetrics(t *testing.T) {
	ctx := context.Background()
	for _, resumed := range []bool{false, true} {
		dir, tb := t.TempDir(), filepath.Join(t.TempDir(), "tb")
		spec := smallSpec(dir)
		spec.Log.TensorBoard = tb
		if resumed {
			if _, err := Run(ctx, spec, Env{World: 1, StopAfter: 6}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Run(ctx, spec, Env{World: 1, Resume: resumed}); err != nil {
			t.Fatal(err)
		}
		checkTBMatchesMetrics(t, tb, dir)
	}
}

package train

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/planner"
)

// readMetricsFile is the records of dir's metrics file, in order.
func readMetricsFile(t *testing.T, dir string) []MetricsLine {
	t.Helper()
	var lines []MetricsLine
	err := ReadMetrics(filepath.Join(dir, MetricsFile), func(m MetricsLine) error {
		lines = append(lines, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// checkMetricsFile fails t unless dir's metrics file holds steps 1 to
// len(want) once each, in order, with the losses want.
func checkMetricsFile(t *testing.T, dir string, want []float32) {
	t.Helper()
	lines := readMetricsFile(t, dir)
	var steps []int
	for _, m := range lines {
		steps = append(steps, m.Step)
	}
	if len(lines) != len(want) {
		t.Fatalf("%s has steps %v, want 1 to %d once each", MetricsFile, steps, len(want))
	}
	for i, m := range lines {
		if m.Step != i+1 || m.Loss != want[i] {
			t.Errorf("%s line %d: step %d loss %v, want step %d loss %v (steps %v)", MetricsFile, i+1, m.Step, m.Loss, i+1, want[i], steps)
		}
		if m.Time <= 0 || m.Memory.Total <= 0 || m.Steps != len(want) {
			t.Errorf("%s line %d: time %v, memory %d, steps %d: want them set", MetricsFile, i+1, m.Time, m.Memory.Total, m.Steps)
		}
	}
}

// TestMetricsResumeContinuesFile: a run stopped after step 6 (its newest
// checkpoint at step 4) and resumed leaves one metrics file with every
// step once, the resumed run's records of steps 5 and 6 replacing the
// first run's, and the losses of an uninterrupted run; the evaluations'
// validation losses are there too.
func TestMetricsResumeContinuesFile(t *testing.T) {
	ctx := context.Background()
	fullDir := t.TempDir()
	full, err := Run(ctx, smallSpec(fullDir), Env{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkMetricsFile(t, fullDir, full.Losses)
	dir := t.TempDir()
	if _, err := Run(ctx, smallSpec(dir), Env{World: 1, StopAfter: 6}); err != nil {
		t.Fatal(err)
	}
	if n := len(readMetricsFile(t, dir)); n != 6 {
		t.Fatalf("after 6 steps the metrics file has %d records", n)
	}
	if _, err := Run(ctx, smallSpec(dir), Env{World: 1, Resume: true}); err != nil {
		t.Fatal(err)
	}
	checkMetricsFile(t, dir, full.Losses)
	var val []int
	for _, m := range readMetricsFile(t, dir) {
		if m.ValLoss != nil {
			val = append(val, m.Step)
		}
	}
	if !slices.Equal(val, []int{6, 12}) {
		t.Errorf("validation losses at steps %v, want 6 and 12 (eval.every 6)", val)
	}
}

// TestMetricsRanksAtLogSteps: with two ranks, the records of the log
// steps (log_every 5, the first and the last) hold both ranks' own
// values; the others hold none.
func TestMetricsRanksAtLogSteps(t *testing.T) {
	spec := dpSpec(1, 2)
	spec.Checkpoint = CkptSpec{Dir: t.TempDir()}
	spec.LogEvery = 5
	runRanks(t, spec, 2, nil)
	var logged []int
	for _, m := range readMetricsFile(t, spec.Checkpoint.Dir) {
		if m.Ranks == nil {
			continue
		}
		logged = append(logged, m.Step)
		if len(m.Ranks) != 2 {
			t.Fatalf("step %d: %d ranks' values, want 2", m.Step, len(m.Ranks))
		}
		for i, r := range m.Ranks {
			if r.Rank != i || r.Memory.Total <= 0 || r.StepMillis <= 0 || r.Coord != nil {
				t.Errorf("step %d: rank %d's values %+v: want its rank, memory and step time, no coord (dp only)", m.Step, i, r)
			}
		}
		if m.Ranks[0].Memory != m.Memory || m.Ranks[0].StepMillis != m.StepMillis {
			t.Errorf("step %d: rank 0's gathered values %+v differ from the record's", m.Step, m.Ranks[0])
		}
	}
	if !slices.Equal(logged, []int{1, 5, 8}) {
		t.Errorf("ranks' values at steps %v, want 1, 5 and 8", logged)
	}
}

// TestCutMetrics: the cut keeps the records up to the step, in order, and
// removes the rest: later steps, a torn last line, what follows a line
// that is not a record, a step out of order.
func TestCutMetrics(t *testing.T) {
	rec := func(step int) string { return `{"step":` + itoa(step) + `,"steps":9,"loss":1,"time":1}` + "\n" }
	for _, tc := range []struct {
		name, in string
		step     int
		want     string
	}{
		{"later steps", rec(1) + rec(2) + rec(3), 2, rec(1) + rec(2)},
		{"all kept", rec(1) + rec(2), 5, rec(1) + rec(2)},
		{"torn last line", rec(1) + rec(2) + `{"step":3,"lo`, 5, rec(1) + rec(2)},
		{"not a record", rec(1) + "garbage\n" + rec(2), 5, rec(1)},
		{"out of order", rec(1) + rec(3) + rec(2), 5, rec(1) + rec(3)},
		{"fresh run", rec(1) + rec(2), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), MetricsFile)
			if err := os.WriteFile(path, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := cutMetrics(path, tc.step); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("cut to step %d:\n%s\nwant\n%s", tc.step, got, tc.want)
			}
		})
	}
	if err := cutMetrics(filepath.Join(t.TempDir(), MetricsFile), 3); err != nil {
		t.Errorf("an absent file: %v", err)
	}
}

// TestReadMetricsNamesBadLine: a line that is not a record (not the
// last) is an error naming the file and the line.
func TestReadMetricsNamesBadLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), MetricsFile)
	os.WriteFile(path, []byte("{\"step\":1}\nnot json\n"), 0o644)
	err := ReadMetrics(path, func(MetricsLine) error { return nil })
	if err == nil || !strings.Contains(err.Error(), path+": line 2") {
		t.Errorf("error %v, want one naming %s: line 2", err, path)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestMetricsRanksCoords: under tp 2 × pp 2 every log step's record holds
// each of the 4 ranks with its own (dp, pp, tp), as planner.Grid places
// it, and rank 0's coord in the record itself.
func TestMetricsRanksCoords(t *testing.T) {
	spec := gridSpec(gridLayout{tp: 2, pp: 2, dp: 1})
	spec.Checkpoint = CkptSpec{Dir: t.TempDir()}
	runRanks(t, spec, 4, nil)
	lines := readMetricsFile(t, spec.Checkpoint.Dir)
	if len(lines) != spec.Steps {
		t.Fatalf("%d records, want %d", len(lines), spec.Steps)
	}
	grid := planner.Grid{TP: 2, PP: 2, DP: 1}
	gathered := 0
	for _, m := range lines {
		if m.Coord == nil || *m.Coord != grid.Coord(0) {
			t.Errorf("step %d: record's coord %v, want rank 0's %v", m.Step, m.Coord, grid.Coord(0))
		}
		if len(m.Ranks) == 0 {
			continue
		}
		if gathered++; len(m.Ranks) != 4 {
			t.Fatalf("step %d: %d ranks' values, want 4", m.Step, len(m.Ranks))
		}
		for i, r := range m.Ranks {
			if r.Coord == nil || *r.Coord != grid.Coord(i) || r.Memory.Total <= 0 {
				t.Errorf("step %d: rank %d: coord %v memory %d, want coord %v and its memory", m.Step, i, r.Coord, r.Memory.Total, grid.Coord(i))
			}
		}
	}
	if gathered != 3 {
		t.Errorf("ranks' values at %d steps, want 3 (the first, the evaluation at 2, the last)", gathered)
	}
}

// TestMetricsNotRegularRefused: a FIFO in metrics.jsonl's place fails the
// run before its first step, naming it, rather than blocking on it.
func TestMetricsNotRegularRefused(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, MetricsFile), 0o644); err != nil {
		t.Skip(err)
	}
	_, err := Run(context.Background(), smallSpec(dir), Env{World: 1})
	if err == nil || !strings.Contains(err.Error(), MetricsFile) {
		t.Errorf("Run = %v, want an error naming %s", err, MetricsFile)
	}
}

// TestMetricsNoStepNoFile: a run that takes no step leaves no metrics
// file (it is opened at the first record), so that a run directory a
// failed start leaves holds nothing and can be removed.
func TestMetricsNoStepNoFile(t *testing.T) {
	dir := t.TempDir()
	tr := &Trainer{spec: smallSpec(dir), env: Env{Warn: func(w string) { t.Error(w) }}}
	if err := tr.openMetrics(); err != nil {
		t.Fatal(err)
	}
	tr.closeMetrics()
	if _, err := os.Lstat(filepath.Join(dir, MetricsFile)); !os.IsNotExist(err) {
		t.Errorf("%s after no step: %v, want none", MetricsFile, err)
	}
}

// TestSummarizeRunNonFinite: a run whose loss became NaN summarises, and
// its JSON writes the NaN as status records do, as a string.
func TestSummarizeRunNonFinite(t *testing.T) {
	dir := t.TempDir()
	recs := `{"step":1,"steps":2,"loss":3,"step_ms":10,"tokens_per_s":100,"time":5}` + "\n" +
		`{"step":2,"steps":2,"loss":"NaN","val_loss":"NaN","step_ms":10,"tokens_per_s":100,"non_finite":true,"time":6}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, MetricsFile), []byte(recs), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := SummarizeRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.LastStep != 2 || len(s.Series) != 2 || s.ValStep != 2 || s.WallSeconds != 1.01 || s.TrainSeconds != 0.02 {
		t.Errorf("summary %+v", s)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"loss":"NaN","val_loss":"NaN"`) {
		t.Errorf("JSON %s: want the NaNs as strings", b)
	}
}

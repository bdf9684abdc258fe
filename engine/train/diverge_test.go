package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
)

// setHook sets a test hook for the test's duration.
func setHook[T any](t *testing.T, hook *T, f T) {
	t.Helper()
	*hook = f
	t.Cleanup(func() { var zero T; *hook = zero })
}

// stepDirs lists the step directories in dir.
func stepDirs(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "step-*"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	slices.Sort(m)
	return m
}

// TestDivergedRunStops: rank 1 of 2 gets a NaN weight before step 7 (the
// loss, being the mean over the ranks, is NaN on both). Both ranks must
// stop at step 7 with a *DivergedError naming it and the last good
// checkpoint (step 6), save nothing from step 7 on, keep the checkpoints
// before it (keep 2: steps 4 and 6), emit step 7's status record with the
// NaN as a string and the non_finite flag, log "loss NaN"; and the run
// must resume from step 6.
func TestDivergedRunStops(t *testing.T) {
	dir := t.TempDir()
	s := dpSpec(1, 2)
	s.Steps, s.LogEvery = 12, 100
	s.Checkpoint = CkptSpec{Dir: dir, Every: 2, Keep: 2}
	setHook(t, &testHookStep, func(tr *Trainer) {
		if tr.spec.Checkpoint.Dir == dir && tr.env.Rank == 1 && tr.step == 6 {
			w := tr.zero.Weights(1)
			w[0] = float32(math.NaN())
			tr.zero.Release(1)
		}
	})
	var log bytes.Buffer
	var recs statusRecords
	errs := make([]error, 2)
	onRanks(t, 2, func(ctx context.Context, r int, c *comm.Communicator) error {
		e := Env{Rank: r, World: 2, LocalWorld: 2, Comm: c}
		recs.env(&e)
		if r == 0 {
			e.Log = &log
		}
		_, errs[r] = Run(ctx, s, e)
		return nil
	})
	good := filepath.Join(dir, ckpt.StepDirName(6))
	for r, err := range errs {
		var de *DivergedError
		if !errors.As(err, &de) || de.Step != 7 || de.Checkpoint != good {
			t.Fatalf("rank %d: %v; want a *DivergedError at step 7 naming %s", r, err, good)
		}
	}
	msg := errs[0].Error()
	for _, want := range []string{"step 7: loss NaN", "lower optim.lr", "gtrain resume --set optim.lr=", good} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if got, want := stepDirs(t, dir), []string{ckpt.StepDirName(4), ckpt.StepDirName(6)}; !slices.Equal(got, want) {
		t.Errorf("checkpoints %v, want %v: nothing after the last finite step, the ones before it kept", got, want)
	}
	lines := strings.Split(strings.TrimSpace(recs.bufs[0].String()), "\n")
	last := lines[len(lines)-1]
	if len(lines) != 7 || !json.Valid([]byte(last)) || !strings.Contains(last, `"loss":"NaN"`) || !strings.Contains(last, `"non_finite":true`) {
		t.Errorf("%d status records, the last %s; want 7, the last with \"loss\":\"NaN\" and \"non_finite\":true", len(lines), last)
	}
	if rs := recs.of(t, 0); rs[len(rs)-1].Step != 7 || !math.IsNaN(float64(rs[len(rs)-1].Loss)) {
		t.Errorf("last record %+v: want step 7 with a NaN loss", rs[len(rs)-1])
	}
	if !strings.Contains(log.String(), "step  7/12 | loss NaN") || !strings.Contains(log.String(), "norm NaN") {
		t.Errorf("log does not show step 7's NaN:\n%s", log.String())
	}
	testHookStep = nil
	res := runRanks(t, s, 2, func(e *Env) { e.Resume = true })
	if res[0].Resumed != 6 || res[0].Steps != 12 || slices.ContainsFunc(res[0].Losses, func(l float32) bool { return !finite(float64(l)) }) {
		t.Errorf("resumed from step %d to %d, losses %v: want 6 to 12, all finite", res[0].Resumed, res[0].Steps, res[0].Losses)
	}
}

// TestHugeLearningRateDiverges: a learning rate of 1000 without clipping
// really diverges. The run stops with a *DivergedError before its last
// step, and every checkpoint left is older than that step and finite.
func TestHugeLearningRateDiverges(t *testing.T) {
	dir := t.TempDir()
	s := smallSpec(dir)
	s.Optim.LR, s.Optim.MinLR, s.Optim.GradClip, s.Optim.WarmupSteps = 1000, 0, 0, 0
	s.Checkpoint.Keep = 1
	res, err := Run(context.Background(), s, Env{World: 1})
	var de *DivergedError
	if !errors.As(err, &de) || res.Steps >= s.Steps {
		t.Fatalf("after %d of %d steps: %v; want a *DivergedError before the end", res.Steps, s.Steps, err)
	}
	t.Logf("%v", err)
	dirs := stepDirs(t, dir)
	if len(dirs) == 0 {
		if de.Checkpoint != "" {
			t.Errorf("the error names %s, but no checkpoint exists", de.Checkpoint)
		}
		return
	}
	newest := filepath.Join(dir, dirs[len(dirs)-1])
	c, err := ckpt.Open(t.Context(), newest)
	if err != nil {
		t.Fatal(err)
	}
	if int(c.Step()) >= de.Step || de.Checkpoint != newest {
		t.Errorf("newest checkpoint %s (step %d), divergence at step %d naming %q", newest, c.Step(), de.Step, de.Checkpoint)
	}
	cfg, _ := s.ModelConfig()
	for _, p := range cfg.Params() {
		v, _, err := c.Tensor(p.Name)
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(v, func(x float32) bool { return !finite(float64(x)) }); i >= 0 {
			t.Fatalf("%s: %s[%d] = %v", newest, p.Name, i, v[i])
		}
	}
}

// TestFP16OverflowAtMinimumScaleStops: with fp16, steps whose numbers
// overflow are skipped and the loss scale halved (16, 8, 4, 2, 1); once
// the scale is at its minimum an overflow can no longer be absorbed, and
// the run stops instead of skipping every step to the end. Here a
// learning rate of 1e20 puts the weights beyond fp16's range after the
// first step. With a checkpoint due meanwhile, the save refuses those
// weights (finite in fp32, infinite in fp16).
func TestFP16OverflowAtMinimumScaleStops(t *testing.T) {
	s := smallSpec("")
	s.Checkpoint, s.Eval = CkptSpec{}, EvalSpec{}
	s.Precision, s.LossScale.InitialScale = "fp16", 16
	s.Optim.LR, s.Optim.MinLR, s.Optim.GradClip, s.Optim.WarmupSteps = 1e20, 0, 0, 0
	var st bytes.Buffer
	res, err := Run(context.Background(), s, Env{World: 1, Status: &st})
	var de *DivergedError
	if !errors.As(err, &de) || de.Step != 6 || !strings.Contains(err.Error(), "bf16 instead of fp16") {
		t.Fatalf("after %d steps: %v; want a *DivergedError at step 6 suggesting bf16", res.Steps, err)
	}
	var scales []float64
	for _, line := range strings.Split(strings.TrimSpace(st.String()), "\n") {
		var r Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		scales = append(scales, r.LossScale)
	}
	if want := []float64{16, 8, 4, 2, 1, 1}; !slices.Equal(scales, want) {
		t.Errorf("loss scales %v, want %v", scales, want)
	}

	dir := t.TempDir()
	s.Checkpoint = CkptSpec{Dir: dir, Every: 2}
	_, err = Run(context.Background(), s, Env{World: 1})
	if !errors.As(err, &de) || de.Step != 2 || !strings.Contains(err.Error(), "checkpoint was refused") {
		t.Fatalf("%v; want the checkpoint of step 2 refused", err)
	}
	if dirs := stepDirs(t, dir); len(dirs) != 0 {
		t.Errorf("checkpoints %v written", dirs)
	}
}

// TestRecordJSON: values that are not finite are written as strings with
// the non_finite flag (json.Marshal fails on NaN), and read back; finite
// ones are written as before.
func TestRecordJSON(t *testing.T) {
	val := float32(math.Inf(-1))
	r := Record{Step: 3, Steps: 9, Loss: float32(math.NaN()), ValLoss: &val, LR: 1e-3, GradNorm: math.Inf(1), TokensPerS: 10}
	b, err := json.Marshal(r)
	if err != nil || !json.Valid(b) {
		t.Fatalf("marshal: %s, %v", b, err)
	}
	for _, want := range []string{`"loss":"NaN"`, `"val_loss":"-Infinity"`, `"grad_norm":"Infinity"`, `"non_finite":true`, `"tokens_per_s":10`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	var back Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(float64(back.Loss)) || !math.IsInf(float64(*back.ValLoss), -1) || !math.IsInf(back.GradNorm, 1) || back.Step != 3 || !back.NonFinite {
		t.Errorf("read back %+v", back)
	}
	b, _ = json.Marshal(Record{Step: 1, Loss: 5.5234, GradNorm: 1.25})
	if !bytes.Contains(b, []byte(`"loss":5.5234,`)) || bytes.Contains(b, []byte("non_finite")) {
		t.Errorf("finite record: %s", b)
	}
}

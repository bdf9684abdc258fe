package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
)

// rankTest is one rank started as the launcher starts it: its job in
// rankenv.JobSpec, an error file, alone (no WORLD_SIZE).
type rankTest struct {
	env     map[string]string
	errFile string
	log     bytes.Buffer
	opts    RankOptions
}

// newRankTest is a rank whose job is spec with its checkpoints in dir.
func newRankTest(t *testing.T, spec Spec) *rankTest {
	t.Helper()
	_, js, err := ResolveIn(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &rankTest{errFile: filepath.Join(t.TempDir(), "error.json")}
	r.env = map[string]string{rankenv.JobSpec: js, rankenv.ErrorFile: r.errFile}
	r.opts = RankOptions{
		Getenv: func(k string) string { return r.env[k] },
		LoadJob: func(context.Context) (Spec, error) {
			t.Fatal("LoadJob called with the launcher's spec set")
			return Spec{}, nil
		},
		Log:  &r.log,
		Warn: func(msg string) { t.Logf("warning: %s", msg) },
	}
	return r
}

func (r *rankTest) run(t *testing.T) error {
	t.Helper()
	return RunRank(t.Context(), r.opts)
}

// errorFile is the message the rank recorded for the launcher, "" if none.
func (r *rankTest) errorFile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(r.errFile)
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	var f struct {
		Message struct {
			Message string `json:"message"`
		} `json:"message"`
	}
	if err != nil || json.Unmarshal(b, &f) != nil {
		t.Fatalf("error file %s: %v: %q", r.errFile, err, b)
	}
	return f.Message.Message
}

// TestRunRankFinishes: a rank of the launcher's job trains it to the end,
// says how to export the weights, and records no error.
func TestRunRankFinishes(t *testing.T) {
	dir := t.TempDir()
	r := newRankTest(t, smallSpec(dir))
	if err := r.run(t); err != nil {
		t.Fatal(err)
	}
	want := "saved " + filepath.Join(dir, ckpt.StepDirName(12)) + "; export the weights with: gtrain ckpt export " + dir
	if !strings.Contains(r.log.String(), want) {
		t.Errorf("log does not say %q:\n%s", want, r.log.String())
	}
	if msg := r.errorFile(t); msg != "" {
		t.Errorf("error file %q after a clean run", msg)
	}
}

// TestRunRankJobFlags: --job or --set cannot change the launcher's spec; the
// usage error names the variable and is recorded for the launcher.
func TestRunRankJobFlags(t *testing.T) {
	r := newRankTest(t, smallSpec(t.TempDir()))
	r.opts.JobFlags = true
	err := r.run(t)
	want := "worker: GTRAIN_JOB_SPEC is set by the launcher; --job and --set cannot change it"
	if err == nil || err.Error() != want || !errors.As(err, new(*usage.Error)) {
		t.Fatalf("RunRank = %v, want the usage error %q", err, want)
	}
	if msg := r.errorFile(t); msg != want {
		t.Errorf("error file %q, want %q", msg, want)
	}
}

// TestRunRankStandalone: without the launcher's spec the rank reads its job
// with LoadJob and resolves it as the launcher would: a relative
// checkpoint.dir is in the working directory.
func TestRunRankStandalone(t *testing.T) {
	t.Chdir(t.TempDir())
	spec := smallSpec("ckpt")
	spec.Steps = 2
	var log bytes.Buffer
	err := RunRank(t.Context(), RankOptions{
		Getenv:  func(string) string { return "" },
		LoadJob: func(context.Context) (Spec, error) { return spec, nil },
		Log:     &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if want := filepath.Join(wd, "ckpt", ckpt.StepDirName(2)); !strings.Contains(log.String(), "saved "+want) {
		t.Errorf("log does not say it saved %s:\n%s", want, log.String())
	}
}

// TestRunRankFaultInjection: GTRAIN_FAULT_FAIL_AFTER_STEP fails the first
// attempt after that step, its checkpoints written; the restart
// (TORCHELASTIC_RESTART_COUNT 1) ignores it and continues from them. A
// value that is not a step is a usage error naming it.
func TestRunRankFaultInjection(t *testing.T) {
	dir := t.TempDir()
	r := newRankTest(t, smallSpec(dir))
	r.env[rankenv.FaultFailAfterStep] = "4"
	err := r.run(t)
	want := "worker: GTRAIN_FAULT_FAIL_AFTER_STEP=4: failing after step 4 on purpose (fault injection for tests)"
	if err == nil || err.Error() != want {
		t.Fatalf("first attempt: %v, want %q", err, want)
	}
	if msg := r.errorFile(t); msg != want {
		t.Errorf("error file %q, want %q", msg, want)
	}
	if _, err := os.Stat(filepath.Join(dir, ckpt.StepDirName(4))); err != nil {
		t.Fatalf("no checkpoint of step 4 before the fault: %v", err)
	}
	r.env[rankenv.RestartCount] = "1"
	r.log.Reset()
	if err := r.run(t); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if !strings.Contains(r.log.String(), "starting at step 4") {
		t.Errorf("the restart did not continue from step 4:\n%s", r.log.String())
	}

	for _, bad := range []string{"0", "x"} {
		r := newRankTest(t, smallSpec(t.TempDir()))
		r.env[rankenv.FaultFailAfterStep] = bad
		err := r.run(t)
		if err == nil || !strings.Contains(err.Error(), `GTRAIN_FAULT_FAIL_AFTER_STEP="`+bad+`": want a step number ≥ 1`) ||
			!errors.As(err, new(*usage.Error)) {
			t.Errorf("GTRAIN_FAULT_FAIL_AFTER_STEP=%s: %v, want a usage error naming it", bad, err)
		}
	}
}

// closedChan is a preemption that has already come.
func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// TestRunRankPreemptedReadingJob: a preemption while the rank reads its job
// interrupts the read (there is nothing to save yet): RunRank returns the
// read's error, which carries a *StopError that is not resumable, and the
// caller's context stays alive.
func TestRunRankPreemptedReadingJob(t *testing.T) {
	ctx := t.Context()
	err := RunRank(ctx, RankOptions{
		Getenv: func(string) string { return "" },
		LoadJob: func(ctx context.Context) (Spec, error) {
			<-ctx.Done() // a read that only stops when told
			return Spec{}, context.Cause(ctx)
		},
		Preempt:       closedChan(),
		PreemptSignal: func() os.Signal { return syscall.SIGUSR1 },
	})
	var stop *StopError
	if !errors.As(err, &stop) || stop.Trainer || stop.Resumable() || stop.Signal != syscall.SIGUSR1 {
		t.Fatalf("RunRank = %v (%#v), want a *StopError of SIGUSR1 before training, not resumable", err, stop)
	}
	if err.Error() != "interrupted by SIGUSR1" {
		t.Errorf("error %q, want %q", err, "interrupted by SIGUSR1")
	}
	if ctx.Err() != nil {
		t.Error("the preemption cancelled the caller's context")
	}
}

// TestRunRankPreempted: how a preempted rank ends. Preempted before its
// trainer is built, it is resumable only when the job already has a
// checkpoint to go on from; preempted while training, it saves one at the
// next step boundary and says so itself.
func TestRunRankPreempted(t *testing.T) {
	t.Run("before training, no checkpoint", func(t *testing.T) {
		r := newRankTest(t, smallSpec(t.TempDir()))
		r.opts.Preempt = closedChan()
		err := r.run(t)
		var stop *StopError
		if !errors.As(err, &stop) || !stop.Trainer || stop.Saved || stop.Resumable() {
			t.Fatalf("RunRank = %v (%#v), want a *StopError with nothing to resume from", err, stop)
		}
		if want := "worker: stopped by SIGTERM before a checkpoint was saved"; err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
	})
	t.Run("before training, the job's checkpoint", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := Run(t.Context(), smallSpec(dir), Env{World: 1, StopAfter: 4}); err != nil {
			t.Fatal(err)
		}
		r := newRankTest(t, smallSpec(dir))
		r.opts.Resume, r.opts.Preempt = true, closedChan()
		err := r.run(t)
		step4 := filepath.Join(dir, ckpt.StepDirName(4))
		var stop *StopError
		if !errors.As(err, &stop) || stop.Saved || stop.Checkpoint != step4 || !stop.Resumable() {
			t.Fatalf("RunRank = %v (%#v), want a *StopError resumable from %s", err, stop, step4)
		}
		if want := "worker: stopped by SIGTERM before training; the job resumes from " + step4; err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
	})
	t.Run("while training", func(t *testing.T) {
		dir := t.TempDir()
		preempt := make(chan struct{})
		setHook(t, &testHookStep, func(tr *Trainer) {
			if tr.step == 2 {
				close(preempt)
			}
		})
		r := newRankTest(t, smallSpec(dir))
		r.opts.Preempt = preempt
		err := r.run(t)
		step3 := filepath.Join(dir, ckpt.StepDirName(3))
		var stop *StopError
		if !errors.As(err, &stop) || !stop.Saved || stop.Checkpoint != step3 || !stop.Resumable() {
			t.Fatalf("RunRank = %v (%#v), want a *StopError that saved %s", err, stop, step3)
		}
		if !strings.Contains(r.log.String(), "preempted at step 3: saved "+step3) {
			t.Errorf("the rank did not say where it saved:\n%s", r.log.String())
		}
	})
}

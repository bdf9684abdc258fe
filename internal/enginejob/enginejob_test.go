package enginejob

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
)

// smallJob is a job file of a few steps of the test model, checkpointing
// into dir (relative to the job's directory).
func smallJob(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "job.yaml")
	body := "model: {preset: test}\ndata: {synthetic: 20000}\nbatch: {micro_batch: 2, seq: 32}\nsteps: 4\n" +
		"checkpoint: {dir: " + dir + ", every: 2}\neval: {every: 0}\nthreads: 1\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// specOf is the spec a Job hands its ranks, decoded from its environment.
func specOf(t *testing.T, j *Job) train.Spec {
	t.Helper()
	if len(j.Env) != 1 || !strings.HasPrefix(j.Env[0], rankenv.JobSpec+"=") {
		t.Fatalf("environment %q, want %s=<spec> alone", j.Env, rankenv.JobSpec)
	}
	var spec train.Spec
	if err := json.Unmarshal([]byte(strings.TrimPrefix(j.Env[0], rankenv.JobSpec+"=")), &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

// TestFreshClaimsAndReleases: a fresh job on this machine gets a new run
// directory under Dir, held under the lock (naming its run id and the
// command line, --env values hidden) until Release, which removes the
// directory since no checkpoint was written; its ranks run gtrain worker
// with the resolved spec.
func TestFreshClaimsAndReleases(t *testing.T) {
	dir := t.TempDir()
	j, err := Fresh(t.Context(), Options{Dir: dir, Ranks: 1, Sets: []string{"steps=3"},
		Args: []string{"/bin/gtrain", "run", "--env", "TOKEN=secret", "--env=KEY=hidden"}})
	if err != nil {
		t.Fatal(err)
	}
	ck := j.Spec.Checkpoint.Dir
	if filepath.Dir(ck) != filepath.Join(dir, "runs") || j.RunID == "" || j.Ranks != 1 || j.From != nil {
		t.Errorf("job: checkpoint dir %s, run id %q, %d ranks, from %v", ck, j.RunID, j.Ranks, j.From)
	}
	if !slices.Equal(j.Command, []string{"gtrain", "worker"}) {
		t.Errorf("command %q, want gtrain worker", j.Command)
	}
	if s := specOf(t, j); s.Steps != 3 || s.Checkpoint.Dir != ck || s.Model.Config.Layers == 0 {
		t.Errorf("the ranks' spec is not the resolved job: %+v", s)
	}
	_, err = ckpt.Lock(ck, ckpt.ThisProcess("other", ""))
	var le *ckpt.LockedError
	if !errors.As(err, &le) || le.Owner.RunID != j.RunID || le.Owner.Command != "gtrain run --env TOKEN=… --env=KEY=…" {
		t.Errorf("a second lock of the claimed directory: %v, want a *LockedError naming run %s and the command without --env values", err, j.RunID)
	}
	j.Release()
	if _, err := os.Lstat(filepath.Join(dir, "runs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Release of a job that wrote nothing: runs/ is still there (%v)", err)
	}
}

// TestFreshDryRunAndHostfile: a dry run and a hostfile job create and
// claim nothing here; both still refuse a used directory.
func TestFreshDryRunAndHostfile(t *testing.T) {
	for _, o := range []Options{{DryRun: true, Ranks: 1}, {Hostfile: true, Ranks: 1}} {
		dir := t.TempDir()
		o.Dir = dir
		j, err := Fresh(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		if j.RunID != "" || filepath.Dir(j.Spec.Checkpoint.Dir) != filepath.Join(dir, "runs") {
			t.Errorf("%+v: run id %q, checkpoint dir %s", o, j.RunID, j.Spec.Checkpoint.Dir)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%+v created %d entries in %s", o, len(ents), dir)
		}
		j.Release()
	}
}

// TestFreshRefusesUsedDir: a fresh job into a directory that holds a run
// is a usage error pointing at gtrain resume (train.CheckFresh, with the
// launcher's prefix), and the directory is released for that resume.
func TestFreshRefusesUsedDir(t *testing.T) {
	dir := t.TempDir()
	job := smallJob(t, "ckpt")
	if _, err := train.Run(t.Context(), mustLoad(t, job, dir), train.Env{World: 1}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{{}, {DryRun: true}} {
		o.Job, o.Dir, o.Ranks = job, dir, 1
		_, err := Fresh(t.Context(), o)
		if !errors.As(err, new(*usage.Error)) || !errors.As(err, new(*train.UsedDirError)) ||
			!strings.HasPrefix(err.Error(), "run: checkpoint.dir "+filepath.Join(dir, "ckpt")+" already holds step-00000004 of a run") {
			t.Errorf("dry run %v: %v, want a usage error saying the directory holds a run", o.DryRun, err)
		}
	}
	j, err := Resume(t.Context(), filepath.Join(dir, "ckpt"), Options{Ranks: 1})
	if err != nil {
		t.Fatalf("resume after the refused fresh job: %v", err)
	}
	j.Release()
}

// mustLoad is the job file path resolved in dir, as its ranks get it.
func mustLoad(t *testing.T, path, dir string) train.Spec {
	t.Helper()
	j, err := Fresh(t.Context(), Options{Job: path, Dir: dir, Ranks: 1, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	j.Release()
	return j.Spec
}

// TestResume: a resume runs gtrain worker --resume on the checkpoint's
// job with --set over it and as many ranks as wrote it, unless told; from
// a step directory, --resume-from names it. A directory another job holds
// is refused, naming that job.
func TestResume(t *testing.T) {
	dir := t.TempDir()
	if _, err := train.Run(t.Context(), mustLoad(t, smallJob(t, "ckpt"), dir), train.Env{World: 1}); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "ckpt")
	var warned []string
	o := Options{Ranks: 1, Sets: []string{"steps=6"}, Warn: func(msg string) { warned = append(warned, msg) }}
	j, err := Resume(t.Context(), root, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(j.Command, []string{"gtrain", "worker", "--resume"}) || j.From.Step() != 4 || j.Ranks != 1 {
		t.Errorf("resume: command %q from step %d on %d ranks", j.Command, j.From.Step(), j.Ranks)
	}
	if s := specOf(t, j); s.Steps != 6 || s.Checkpoint.Dir != root {
		t.Errorf("resume: the ranks' spec has %d steps in %s, want 6 in %s", s.Steps, s.Checkpoint.Dir, root)
	}
	if _, err := Resume(t.Context(), root, o); !errors.As(err, new(*ckpt.LockedError)) {
		t.Errorf("a second resume of a held directory: %v, want a *ckpt.LockedError", err)
	}
	j.Release()

	step := filepath.Join(root, ckpt.StepDirName(2))
	o.Ranks, o.RanksGiven = 2, true // the checkpoint's micro-step of 2 sequences divides over 2 replicas
	j, err = Resume(t.Context(), step, o)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Release()
	if !slices.Equal(j.Command, []string{"gtrain", "worker", "--resume", "--resume-from", step}) || j.Ranks != 2 {
		t.Errorf("resume from a step: command %q on %d ranks, want --resume-from %s on the 2 asked for", j.Command, j.Ranks, step)
	}
	if len(warned) != 0 {
		t.Errorf("warnings about valid checkpoints: %q", warned)
	}
}

// TestResumeNothing: a directory without a valid checkpoint and a path
// that is no directory are usage errors naming the path.
func TestResumeNothing(t *testing.T) {
	empty := t.TempDir()
	for path, want := range map[string]string{
		empty:                           "no valid checkpoint to resume from",
		filepath.Join(empty, "missing"): "no such directory",
	} {
		_, err := Resume(t.Context(), path, Options{Ranks: 1})
		if !errors.As(err, new(*usage.Error)) || !strings.HasPrefix(err.Error(), "resume: "+path) || !strings.Contains(err.Error(), want) {
			t.Errorf("resume %s: %v, want a usage error saying %q", path, err, want)
		}
	}
	if ents, _ := os.ReadDir(empty); len(ents) != 1 { // the lock file the claim left
		t.Errorf("%s holds %d entries after the refused resume, want only the lock file", empty, len(ents))
	}
}

// TestDryResumeOfBusyDir: a dry run that finds no valid checkpoint in a
// directory another job holds says so, naming that job and to run it
// again (the job may have pruned or not yet committed what it read); of a
// directory no one holds it says only what it found.
func TestDryResumeOfBusyDir(t *testing.T) {
	dir := t.TempDir()
	_, err := Resume(t.Context(), dir, Options{Ranks: 1, DryRun: true})
	if !errors.As(err, new(*usage.Error)) || strings.Contains(err.Error(), "in use") {
		t.Fatalf("dry run of a free directory: %v, want a usage error saying nothing of its use", err)
	}
	l, err := ckpt.Lock(dir, ckpt.ThisProcess("job-A", "gtrain run --job a.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	_, err = Resume(t.Context(), dir, Options{Ranks: 1, DryRun: true})
	want := `no valid checkpoint to resume from (see ` + "`gtrain ckpt ls " + dir + "`" + `); the directory is in use by another gtrain job "job-A"`
	if !errors.As(err, new(*usage.Error)) || !strings.Contains(err.Error(), want) || !strings.HasSuffix(err.Error(), "run the dry run again") {
		t.Errorf("dry run of a held directory: %v, want a usage error saying %q ... run the dry run again", err, want)
	}
}

package train

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
)

// TestRestartResumes: a restart of a job (Env.Restart) resumes from the
// newest valid checkpoint of its directory and continues exactly as the
// uninterrupted run; without one it starts afresh; a fresh run (neither
// Restart nor Resume) is still refused the directory.
func TestRestartResumes(t *testing.T) {
	ctx := context.Background()
	full, err := Run(ctx, smallSpec(t.TempDir()), Env{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var log bytes.Buffer
	first, err := Run(ctx, smallSpec(dir), Env{World: 1, Restart: true, StopAfter: 6, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if first.Resumed != 0 || !strings.Contains(log.String(), "no valid checkpoint in "+dir+" yet: starting afresh") {
		t.Errorf("restart into an empty directory: resumed from %d, log:\n%s", first.Resumed, log.String())
	}
	if _, err := Run(ctx, smallSpec(dir), Env{World: 1}); err == nil || !strings.Contains(err.Error(), "gtrain resume") {
		t.Errorf("a fresh run into the used directory: %v, want it refused", err)
	}
	log.Reset()
	res, err := Run(ctx, smallSpec(dir), Env{World: 1, Restart: true, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 4 || !strings.Contains(log.String(), "restart: resumed from "+filepath.Join(dir, ckpt.StepDirName(4))+" at step 4") {
		t.Errorf("restart resumed from step %d, want 4; log:\n%s", res.Resumed, log.String())
	}
	if !slices.Equal(res.Losses, full.Losses[4:]) {
		t.Errorf("losses after the restart differ from the uninterrupted run:\nrestart %v\nfull    %v", res.Losses, full.Losses[4:])
	}
}

// TestRestartOfResume: a restart of a resumed job continues from the
// newest checkpoint, not from the step the job was resumed from; and
// without any valid checkpoint it fails rather than start over.
func TestRestartOfResume(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := Run(ctx, smallSpec(dir), Env{World: 1, StopAfter: 8}); err != nil {
		t.Fatal(err)
	}
	res, err := Run(ctx, smallSpec(dir), Env{World: 1, Restart: true, ResumeFrom: filepath.Join(dir, ckpt.StepDirName(4)), StopAfter: 9})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 8 {
		t.Errorf("restart of a job resumed from step 4 resumed from %d, want the newest, 8", res.Resumed)
	}
	_, err = Run(ctx, smallSpec(t.TempDir()), Env{World: 1, Restart: true, Resume: true})
	if !errors.Is(err, ckpt.ErrNoCheckpoint) {
		t.Errorf("restart of a resume without checkpoints: %v, want ErrNoCheckpoint", err)
	}
}

// TestResumeFromOlderStep: resuming from a step directory older than the
// newest takes exactly that step, says so, and sets the newer step
// directories aside so that the two histories never mix.
func TestResumeFromOlderStep(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	full, err := Run(ctx, smallSpec(dir), Env{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	res, err := Run(ctx, smallSpec(dir), Env{World: 1, ResumeFrom: filepath.Join(dir, ckpt.StepDirName(4)), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 4 || !slices.Equal(res.Losses, full.Losses[4:]) {
		t.Errorf("resumed from step %d with losses %v, want step 4 and %v", res.Resumed, res.Losses, full.Losses[4:])
	}
	aside, _ := filepath.Glob(filepath.Join(dir, ckpt.SupersededPrefix+"*", "step-*"))
	if len(aside) != 2 || filepath.Base(aside[0]) != ckpt.StepDirName(8) || filepath.Base(aside[1]) != ckpt.StepDirName(12) {
		t.Errorf("set aside: %v, want steps 8 and 12", aside)
	}
	for _, want := range []string{"resuming from step-00000004, older than the newest step directory: moved step-00000008, step-00000012 to " + dir, "resumed from " + filepath.Join(dir, ckpt.StepDirName(4)) + " at step 4"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, log.String())
		}
	}
	if c, ok := NewestValid(t.Context(), dir); !ok || c.Step() != 12 {
		t.Errorf("newest checkpoint after the resumed run: %v", c)
	}
}

// TestCheckpointDirCheckedBeforeFirstStep: a checkpoint directory that is
// locked by another writer, or cannot be created, fails the run before it
// trains a step, naming the directory.
func TestCheckpointDirCheckedBeforeFirstStep(t *testing.T) {
	ctx := context.Background()
	locked := t.TempDir()
	l, err := ckpt.LockWriter(locked, ckpt.ThisProcess("other-job", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"locked": locked, "uncreatable": filepath.Join(file, "ckpt")} {
		t.Run(name, func(t *testing.T) {
			res, err := Run(ctx, smallSpec(dir), Env{World: 1})
			if err == nil || !strings.Contains(err.Error(), dir) {
				t.Fatalf("run: %v, want an error naming %s", err, dir)
			}
			if len(res.Losses) != 0 {
				t.Errorf("trained %d steps before failing", len(res.Losses))
			}
			if name == "locked" && (!errors.As(err, new(*ckpt.LockedError)) || !strings.Contains(err.Error(), "other-job")) {
				t.Errorf("run into a locked directory: %v, want a *ckpt.LockedError naming other-job", err)
			}
		})
	}
}

// TestStartingPointStopsWhenContextEnds: the verification of the checkpoint
// a run starts from (resume, resume from a step, restart, and the check that
// a fresh run's directory is unused) gives up when the run's context has
// ended, with its cause, instead of reading every checkpoint file first or
// starting afresh.
func TestStartingPointStopsWhenContextEnds(t *testing.T) {
	dir := t.TempDir()
	if _, err := Run(t.Context(), smallSpec(dir), Env{World: 1, StopAfter: 4}); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("interrupted by SIGINT")
	for _, tc := range []struct {
		name string
		env  Env
	}{
		{"resume", Env{Resume: true}},
		{"resume from a step", Env{ResumeFrom: filepath.Join(dir, ckpt.StepDirName(4))}},
		{"restart", Env{Restart: true}},
		{"fresh", Env{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env.World = 1
			tr, err := New(smallSpec(dir), tc.env)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			ctx, cancel := context.WithCancelCause(t.Context())
			cancel(cause)
			tr.runCtx = ctx
			if c, err := tr.startingPoint(); c != nil || !errors.Is(err, cause) {
				t.Errorf("startingPoint = %v, %v; want the context's cause", c, err)
			}
		})
	}
}

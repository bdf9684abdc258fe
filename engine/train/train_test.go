package train

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
)

// smallSpec is a job that trains in well under a second.
func smallSpec(dir string) Spec {
	s := DefaultSpec()
	s.Model = ModelSpec{Preset: "test"}
	s.Data.Synthetic = 20_000
	s.Batch = BatchSpec{MicroBatch: 2, Seq: 32, GradAccum: 2}
	s.Steps = 12
	s.Optim.WarmupSteps = 2
	s.Checkpoint = CkptSpec{Dir: dir, Every: 4, Keep: 0}
	s.Eval = EvalSpec{Every: 6, Batches: 2}
	s.Threads = 2
	return s
}

// TestResumeIsBitIdentical: a run interrupted after step 6 (last checkpoint
// at step 4) and resumed must produce exactly the losses of an
// uninterrupted run from step 5 on: same data order, same optimizer state.
func TestResumeIsBitIdentical(t *testing.T) {
	ctx := context.Background()
	full, err := Run(ctx, smallSpec(t.TempDir()), Env{World: 1})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	part, err := Run(ctx, smallSpec(dir), Env{World: 1, StopAfter: 6})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(part.Losses, full.Losses[:6]) {
		t.Fatalf("the first 6 losses differ between two identical runs:\n%v\n%v", part.Losses, full.Losses[:6])
	}
	res, err := Run(ctx, smallSpec(dir), Env{World: 1, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 4 {
		t.Fatalf("resumed from step %d, want 4 (the newest checkpoint)", res.Resumed)
	}
	if !slices.Equal(res.Losses, full.Losses[4:]) {
		t.Errorf("losses after resume differ from the uninterrupted run:\nresumed %v\nfull    %v", res.Losses, full.Losses[4:])
	}
	if res.ValLoss != full.ValLoss {
		t.Errorf("final validation loss %v, uninterrupted %v", res.ValLoss, full.ValLoss)
	}
}

// TestResumeSkipsDamagedCheckpoint: the newest checkpoint with a flipped
// byte is skipped with a warning and the one before it is used.
func TestResumeSkipsDamagedCheckpoint(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := Run(ctx, smallSpec(dir), Env{World: 1, StopAfter: 8}); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, ckpt.StepDirName(8), ckpt.RankFileName(0))
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	res, err := Run(ctx, smallSpec(dir), Env{World: 1, Resume: true, Warn: func(s string) { warnings = append(warnings, s) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 4 {
		t.Errorf("resumed from step %d, want 4 (step 8 is damaged)", res.Resumed)
	}
	if len(warnings) == 0 || !strings.Contains(strings.Join(warnings, "\n"), ckpt.StepDirName(8)) {
		t.Errorf("no warning naming the damaged checkpoint; got %q", warnings)
	}
}

func TestFreshRunRefusesUsedDirectory(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := Run(ctx, smallSpec(dir), Env{World: 1, StopAfter: 4}); err != nil {
		t.Fatal(err)
	}
	_, err := Run(ctx, smallSpec(dir), Env{World: 1})
	if err == nil || !strings.Contains(err.Error(), "gtrain resume") {
		t.Fatalf("a second fresh run into a used checkpoint.dir: %v, want an error pointing at gtrain resume", err)
	}
}

func TestSpecValidate(t *testing.T) {
	for name, mut := range map[string]func(*Spec){
		"no steps":        func(s *Spec) { s.Steps = 0 },
		"unknown preset":  func(s *Spec) { s.Model.Preset = "gpt5" },
		"heads mismatch":  func(s *Spec) { s.Model.Heads = 3 },
		"seq over model":  func(s *Spec) { s.Batch.Seq = 4096 },
		"no data":         func(s *Spec) { s.Data.Synthetic = 0 },
		"zero lr":         func(s *Spec) { s.Optim.LR = 0 },
		"bad recompute":   func(s *Spec) { s.Recompute = "some" },
		"tensor parallel": func(s *Spec) { s.Parallel.TP = 3 }, // tiny's 4 heads
		"pipeline":        func(s *Spec) { s.Parallel.PP = 5 }, // tiny's 4 layers
		"zero stage 4":    func(s *Spec) { s.Parallel.ZeroStage = 4 },
		"negative dp":     func(s *Spec) { s.Parallel.DP = -1 },
		"precision":       func(s *Spec) { s.Precision = "fp8" },
		"grad dtype":      func(s *Spec) { s.Precision, s.Parallel.GradDType = "bf16", "fp16" },
		"negative bucket": func(s *Spec) { s.Parallel.BucketMB = -1 },
		"zero micro":      func(s *Spec) { s.Batch.MicroBatch = 0 },
		"negative keep":   func(s *Spec) { s.Checkpoint.Keep = -1 },
		"negative thread": func(s *Spec) { s.Threads = -1 },
	} {
		s := DefaultSpec()
		mut(&s)
		if err := s.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if err := DefaultSpec().Validate(); err != nil {
		t.Errorf("default spec: %v", err)
	}
}

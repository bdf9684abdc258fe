package main

import (
	"bytes"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/engine/train"
)

// TestWorkerExit: a rank stopped by preemption exits 75 when the job can
// resume from a checkpoint, else 128+n; its message is printed once, as
// gtrain's error line, unless the trainer already said where it saved.
// Other errors pass through to ExitCode and printError unchanged.
func TestWorkerExit(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		code   int
		stderr string
	}{
		{"saved at the signal", &train.StopError{Signal: syscall.SIGUSR1, Trainer: true, Checkpoint: "ck/step-3", Saved: true}, 75, ""},
		{"before training, job's checkpoint", &train.StopError{Signal: syscall.SIGTERM, Trainer: true, Checkpoint: "ck/step-4"}, 75,
			"gtrain: worker: stopped by SIGTERM before training; the job resumes from ck/step-4\n"},
		{"before a checkpoint", &train.StopError{Signal: syscall.SIGTERM, Trainer: true}, 143,
			"gtrain: worker: stopped by SIGTERM before a checkpoint was saved\n"},
		{"reading the job", fmt.Errorf("job: read j: %w", &train.StopError{Signal: syscall.SIGUSR1}), 138,
			"gtrain: job: read j: interrupted by SIGUSR1\n"},
		{"other failure", errors.New("train: step 3: loss is NaN"), ExitFailure, "gtrain: train: step 3: loss is NaN\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := workerExit(tt.err)
			printError(&stderr, err) // as Main does
			if got := ExitCode(err); got != tt.code {
				t.Errorf("exit code %d, want %d", got, tt.code)
			}
			if stderr.String() != tt.stderr {
				t.Errorf("stderr %q, want %q", stderr.String(), tt.stderr)
			}
		})
	}
}

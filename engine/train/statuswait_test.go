package train

import (
	"bufio"
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// TestStepWaitIsTheStepsOwn: a status record's comm_wait_ms is the time
// blocked during its own step, not the waits between steps (the previous
// step's evaluation, checkpoint and log gather). comm.BlockedTime is the
// process's, shared by in-process ranks, and a real wait lasts what the
// machine makes it; so the count is a stub: every read adds 1 µs (the
// step's own wait, between its two reads), and before every step the test
// adds an hour (the waits between steps). Each record must say 0.001 ms;
// counting from the last record, it said the capped step time.
func TestStepWaitIsTheStepsOwn(t *testing.T) {
	var count time.Duration // one rank: read and advanced on the test's goroutine only
	old := blockedTime
	blockedTime = func() time.Duration {
		count += time.Microsecond
		return count
	}
	t.Cleanup(func() { blockedTime = old })
	setHook(t, &testHookStep, func(*Trainer) { count += time.Hour })

	s := smallSpec("")
	s.Steps, s.Threads = 4, 1
	s.Eval = EvalSpec{Every: 2, Batches: 1}
	var status bytes.Buffer
	if _, err := Run(t.Context(), s, Env{World: 1, Status: &status}); err != nil {
		t.Fatal(err)
	}
	var n int
	for sc := bufio.NewScanner(&status); sc.Scan(); n++ {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("record %q: %v", sc.Text(), err)
		}
		if r.WaitMillis != 0.001 {
			t.Errorf("step %d: comm_wait_ms %g, want 0.001 (the step's own wait; step_ms %g)", r.Step, r.WaitMillis, r.StepMillis)
		}
	}
	if n != s.Steps {
		t.Errorf("%d status records, want %d", n, s.Steps)
	}
}

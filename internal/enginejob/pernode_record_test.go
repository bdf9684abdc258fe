package enginejob

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/rankenv"
)

// TestRecordRunDir: node 0 of a per-node job records the job in a new
// checkpoint directory (creating it), accepts the directory again for the
// same job, and refuses it to another job (naming both digests) and when
// its record is malformed.
func TestRecordRunDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs", "job-1")
	job := func(lr string) *Job {
		j := &Job{Command: []string{"gtrain", "worker", "--resume-if-any"}, Env: []string{rankenv.JobSpec + `={"lr":` + lr + `}`}, perNodeID: "job-1"}

		j.Spec.Checkpoint.Dir = dir
		return j
	}
	a, b := job("1"), job("2")
	for i := range 2 { // records, then finds its own record
		if err := a.recordRunDir(t.Context()); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	rec, err := os.ReadFile(filepath.Join(dir, JobRecordName))
	if err != nil || !strings.Contains(string(rec), a.Digest()) || !strings.Contains(string(rec), `"job-1"`) {
		t.Fatalf("%s: %q, %v: want the job's id and digest %s", JobRecordName, rec, err, a.Digest())
	}
	err = b.recordRunDir(t.Context())
	if err == nil || !strings.Contains(err.Error(), "job digest "+a.Digest()) || !strings.Contains(err.Error(), "job digest "+b.Digest()) {
		t.Errorf("another job: %v, want a refusal naming digests %s and %s", err, a.Digest(), b.Digest())
	}
	for _, bad := range []string{"{not json", `{"rdzv_id": "job-1"}`} {
		if err := os.WriteFile(filepath.Join(dir, JobRecordName), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := a.recordRunDir(t.Context()); err == nil || !strings.Contains(err.Error(), "malformed job record") {
			t.Errorf("record %q: %v, want a refusal saying it is malformed", bad, err)
		}
	}
}

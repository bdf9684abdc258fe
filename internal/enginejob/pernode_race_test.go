package enginejob

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
)

// TestRecordRunDirRace: the node 0s of two different jobs started at the
// same moment with one --rdzv-id both find no record in the run
// directory (the test holds each at the point of creating it until both
// are there); exactly one records its job, and the other refuses in one
// line naming the record's directory and file and the winner's digest.
// Before, both wrote the record, the last rename winning, and both jobs
// ran in one directory.
func TestRecordRunDirRace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs", "same-id")
	jobs := make([]*Job, 2)
	for i, lr := range []string{"1", "2"} {
		jobs[i] = &Job{Command: []string{"gtrain", "worker", "--resume-if-any"}, Env: []string{rankenv.JobSpec + `={"lr":` + lr + `}`}, perNodeID: "same-id"}
		jobs[i].Spec.Checkpoint.Dir = dir
	}
	var arrived sync.WaitGroup
	arrived.Add(len(jobs))
	beforeCreate = func() { arrived.Done(); arrived.Wait() }
	defer func() { beforeCreate = nil }()
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { errs[i] = j.recordRunDir(t.Context()) })
	}
	wg.Wait()

	b, err := os.ReadFile(filepath.Join(dir, JobRecordName))
	var rec jobRecord
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		t.Fatalf("%s: %v", JobRecordName, err)
	}
	won := -1
	for i, j := range jobs {
		if j.Digest() == rec.Digest {
			won = i
		}
	}
	if won < 0 {
		t.Fatalf("record %q names neither job (%s, %s)", b, jobs[0].Digest(), jobs[1].Digest())
	}
	lost := 1 - won
	if errs[won] != nil {
		t.Errorf("the job recorded (%s) failed: %v", jobs[won].Digest(), errs[won])
	}
	err = errs[lost]
	if err == nil {
		t.Fatalf("both jobs recorded themselves in %s; the record names %s", dir, rec.Digest)
	}
	msg := err.Error()
	if !errors.As(err, new(*usage.Error)) || strings.Contains(msg, "\n") || !strings.Contains(msg, dir) ||
		!strings.Contains(msg, JobRecordName) || !strings.Contains(msg, "job digest "+jobs[won].Digest()) {
		t.Errorf("the other job: %v; want a one-line usage error naming %s, %s and the recorded digest %s", err, dir, JobRecordName, jobs[won].Digest())
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".*")); len(tmp) > 0 {
		t.Errorf("temporary files left in %s: %v", dir, tmp)
	}
}

// TestCreateExclusive: where the file system has no hard links, the
// record is created with O_EXCL: a second create fails with fs.ErrExist
// and leaves the first record as it was.
func TestCreateExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), JobRecordName)
	if err := createExclusive(path, []byte("first\n")); err != nil {
		t.Fatal(err)
	}
	if err := createExclusive(path, []byte("second\n")); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second create: %v, want fs.ErrExist", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "first\n" {
		t.Errorf("record %q, %v: want the first", b, err)
	}
}

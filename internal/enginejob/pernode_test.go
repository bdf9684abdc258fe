package enginejob

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gtrain/gtrain/internal/usage"
)

// TestFreshPerNode: one node's part of a per-node job names its run
// directory runs/<run id>, the same on every node, and creates and claims
// nothing (rank 0 does); the same job on two nodes has the same digest,
// another setting another. A run id that is no plain name is a usage
// error naming it.
func TestFreshPerNode(t *testing.T) {
	dir := t.TempDir()
	fresh := func(id string, sets ...string) (*Job, error) {
		return Fresh(t.Context(), Options{Dir: dir, PerNode: true, RunID: id, Ranks: 1, Sets: append([]string{"model.preset=test", "steps=3"}, sets...)})
	}
	a, err := fresh("job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	if want := filepath.Join(dir, "runs", "job-1"); a.Spec.Checkpoint.Dir != want || a.RunID != "" {
		t.Errorf("checkpoint dir %s, run id %q: want %s and no lock", a.Spec.Checkpoint.Dir, a.RunID, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "runs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s/runs: %v: want nothing created on a node", dir, err)
	}
	b, err := fresh("job-1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := fresh("job-1", "optim.lr=0.003")
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest() != b.Digest() || a.Digest() == c.Digest() {
		t.Errorf("digests %s, %s (the same job), %s (another lr): want the first two equal, the third not", a.Digest(), b.Digest(), c.Digest())
	}
	for _, id := range []string{"../up", "a/b", ".hidden", ""} {
		if _, err := fresh(id); !errors.As(err, new(*usage.Error)) {
			t.Errorf("run id %q: %v, want a usage error", id, err)
		}
	}
}

package enginejob

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
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

// TestPlannerStateCarried: a planner that joins at attempt 1 given the
// state the others' planners returned for attempt 0 (launch.World.State,
// as a per-node job's rounds carry it) lays the job out as they do: the
// global batch of the first world (2 ranks × micro_batch 3), not of its
// own first (3 ranks).
func TestPlannerStateCarried(t *testing.T) {
	j, err := Fresh(t.Context(), Options{Dir: t.TempDir(), PerNode: true, RunID: "carried", Ranks: 1,
		Sets: []string{"model.preset=test", "steps=3", "batch.micro_batch=3"}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Release()
	old := j.Planner(PlanOptions{})
	first, err := old(t.Context(), launch.World{Attempt: 0, Size: 2})
	if err != nil || first.State == "" {
		t.Fatalf("attempt 0: state %q, %v", first.State, err)
	}
	want, err := old(t.Context(), launch.World{Attempt: 1, Size: 3, State: first.State})
	if err != nil {
		t.Fatal(err)
	}
	got, err := j.Planner(PlanOptions{})(t.Context(), launch.World{Attempt: 1, Size: 3, State: first.State})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Env, want.Env) || got.State != want.State || len(got.Env) != 1 {
		t.Errorf("the newcomer's attempt 1: env %q, want %q", got.Env, want.Env)
	}
	alone, err := j.Planner(PlanOptions{})(t.Context(), launch.World{Attempt: 1, Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(alone.Env, want.Env) {
		t.Errorf("without the state a newcomer planned as the others: the test shows nothing")
	}
}

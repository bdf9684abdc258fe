package train

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestResolveInCheckpointDir: the default checkpoint directory is
// runs/<start time>, created at once; two runs started in the same second
// get two directories. A dry run creates none, and a hostfile job's name is
// unique without being created here.
func TestResolveInCheckpointDir(t *testing.T) {
	now := time.Date(2026, 11, 22, 19, 30, 12, 0, time.UTC)
	fresh := func(runs string) (string, error) { return FreshRunDir(runs, now) }
	dir := t.TempDir()
	s, js, err := ResolveIn(DefaultSpec(), dir, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "runs", "20261122-193012"); s.Checkpoint.Dir != want {
		t.Errorf("checkpoint dir %s, want %s", s.Checkpoint.Dir, want)
	}
	if !strings.Contains(js, `"layers":4`) {
		t.Errorf("the spec for the ranks is not resolved: %s", js)
	}
	s2, _, err := ResolveIn(DefaultSpec(), dir, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Checkpoint.Dir == s.Checkpoint.Dir {
		t.Errorf("a second run in the same second reuses %s", s.Checkpoint.Dir)
	}
	for _, d := range []string{s.Checkpoint.Dir, s2.Checkpoint.Dir} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			t.Errorf("%s was not created: %v", d, err)
		}
	}
	root := filepath.Join(dir, "runs")
	if next, err := NextRunDir(root, now); err != nil || next != filepath.Join(root, "20261122-193012-3") {
		t.Errorf("dry run: %q, %v; want the next free name, -3", next, err)
	}
	a, _ := RemoteRunDir(root, now)
	b, _ := RemoteRunDir(root, now)
	if a == b || !strings.HasPrefix(filepath.Base(a), "20261122-193012-") {
		t.Errorf("hostfile jobs in the same second: %s and %s", a, b)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 2 {
		t.Errorf("%s holds %d entries, want the 2 created", root, len(ents))
	}
}

// TestResolveInRelativeDir: a checkpoint.dir of the spec is taken relative
// to the ranks' directory and no run directory is made for it.
func TestResolveInRelativeDir(t *testing.T) {
	spec := DefaultSpec()
	spec.Checkpoint.Dir = "ckpt/../mine"
	s, _, err := ResolveIn(spec, "/work", func(string) (string, error) {
		t.Error("a run directory was made for a spec that names its own")
		return "", nil
	})
	if err != nil || s.Checkpoint.Dir != "/work/mine" {
		t.Errorf("checkpoint dir %q, %v; want /work/mine", s.Checkpoint.Dir, err)
	}
}

// TestFreshRunDirConcurrent: runs choosing their directory at the same
// moment in separate goroutines each get their own.
func TestFreshRunDirConcurrent(t *testing.T) {
	now := time.Date(2026, 11, 22, 19, 30, 12, 0, time.UTC)
	root := filepath.Join(t.TempDir(), "runs")
	const n = 8
	dirs := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			d, err := FreshRunDir(root, now)
			if err != nil {
				t.Error(err)
			}
			dirs <- d
		})
	}
	wg.Wait()
	close(dirs)
	seen := map[string]bool{}
	for d := range dirs {
		if seen[d] {
			t.Errorf("%s given to two runs", d)
		}
		seen[d] = true
	}
	if len(seen) != n {
		t.Errorf("%d directories for %d runs", len(seen), n)
	}
}

// TestCheckFresh: the one check that a new run's directory holds no run,
// which the launcher and rank 0 both make: a used directory is a
// *UsedDirError naming its step, an absent or empty one is fresh, and an
// ended context gives its cause.
func TestCheckFresh(t *testing.T) {
	used := t.TempDir()
	if _, err := Run(t.Context(), smallSpec(used), Env{World: 1, StopAfter: 4}); err != nil {
		t.Fatal(err)
	}
	var ue *UsedDirError
	if err := CheckFresh(t.Context(), used); !errors.As(err, &ue) || ue.Dir != used || ue.Step != "step-00000004" {
		t.Errorf("used directory: %v, want a *UsedDirError naming step-00000004", err)
	} else if !strings.Contains(err.Error(), "gtrain resume "+used) {
		t.Errorf("used directory: %q does not say to resume it", err)
	}
	for _, dir := range []string{t.TempDir(), filepath.Join(t.TempDir(), "absent")} {
		if err := CheckFresh(t.Context(), dir); err != nil {
			t.Errorf("%s: %v, want fresh", dir, err)
		}
	}
	cause := errors.New("interrupted by SIGINT")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	if err := CheckFresh(ctx, used); !errors.Is(err, cause) {
		t.Errorf("after cancel: %v, want the cause", err)
	}
}

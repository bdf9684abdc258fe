package train

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// probeEnv places 4 in-process ranks on two hosts, a (ranks 0 and 1) and
// b (ranks 2 and 3), as gtrain run tells them.
func probeEnv(e Env) Env {
	e.LocalWorld = 2
	e.Host = []string{"a", "a", "b", "b"}[e.Rank]
	return e
}

// probesIn lists the probe files left in dir.
func probesIn(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, ".gtrain-probe*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestProbeSharedDir: ranks on two hosts that share checkpoint.dir train
// and leave no probe behind.
func TestProbeSharedDir(t *testing.T) {
	dir := t.TempDir()
	s := dpSpec(1, 4)
	s.Steps, s.Checkpoint = 2, CkptSpec{Dir: dir, Every: 2}
	res := runRanks(t, s, 4, func(e *Env) { *e = probeEnv(*e) })
	if res[0].Steps != 2 {
		t.Fatalf("trained %d steps, want 2", res[0].Steps)
	}
	if p := probesIn(t, dir); len(p) != 0 {
		t.Errorf("probes left behind: %v", p)
	}
}

// TestProbeRefusesUnsharedDir: host b's ranks write their probes in a
// directory of their own (a test hook: what a host that mounts something
// else at checkpoint.dir sees), and a stale probe of rank 2 from an
// earlier run lies in the real one. Every rank refuses to start before
// its first step: rank 0 naming host b's ranks and saying what to do, the
// others pointing at rank 0. The probes are removed.
func TestProbeRefusesUnsharedDir(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	setHook(t, &probeWait, 100*time.Millisecond) // the probes are missing for good: no need to wait long
	setHook(t, &testHookProbeDir, func(rank int, d string) string {
		if rank >= 2 {
			return filepath.Join(other, "host-b", filepath.Base(d))
		}
		return d
	})
	stale := filepath.Join(dir, probeName(2))
	if err := os.WriteFile(stale, []byte("earlier!"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := dpSpec(1, 4)
	s.Checkpoint = CkptSpec{Dir: dir, Every: 2}
	res := make([]Result, 4)
	errs := make([]error, 4)
	onRanksAll(t, 4, func(ctx context.Context, r int, e Env) {
		res[r], errs[r] = Run(ctx, s, probeEnv(e))
	})
	want := "train: checkpoint.dir " + dir + " is not shared: ranks 2, 3 on host b wrote probes that rank 0 on host a cannot see; " +
		"rank 0 commits a checkpoint only when it sees every rank's file: put checkpoint.dir on a filesystem every host mounts"
	if errs[0] == nil || errs[0].Error() != want {
		t.Errorf("rank 0: %v\nwant %s", errs[0], want)
	}
	for r := 1; r < 4; r++ {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "rank 0 found checkpoint.dir "+dir+" is not shared by every host (see its log)") {
			t.Errorf("rank %d: %v, want it to point at rank 0", r, errs[r])
		}
	}
	for r, res := range res {
		if res.Steps != 0 {
			t.Errorf("rank %d trained %d steps before refusing", r, res.Steps)
		}
	}
	if p := probesIn(t, filepath.Join(other, "host-b", filepath.Base(dir))); len(p) != 0 {
		t.Errorf("host b's probes left behind: %v", p)
	}
	if p := probesIn(t, dir); len(p) != 1 || p[0] != stale {
		t.Errorf("probes in checkpoint.dir after the refusal: %v, want only the stale one", p)
	}
}

// TestProbeUnwritable: a rank that cannot write its probe fails with its
// own reason, and rank 0 names it (without waiting for the probes).
func TestProbeUnwritable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	setHook(t, &testHookProbeDir, func(rank int, d string) string {
		if rank == 3 {
			return filepath.Join(file, "ckpt") // under a regular file: cannot be created
		}
		return d
	})
	s := dpSpec(1, 4)
	s.Checkpoint = CkptSpec{Dir: dir, Every: 2}
	errs := make([]error, 4)
	onRanksAll(t, 4, func(ctx context.Context, r int, e Env) {
		_, errs[r] = Run(ctx, s, probeEnv(e))
	})
	if errs[3] == nil || !strings.Contains(errs[3].Error(), "rank 3 on host b cannot write a probe file there") {
		t.Errorf("rank 3: %v, want its own reason", errs[3])
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 3 on host b could not write a probe file there (see its error)") {
		t.Errorf("rank 0: %v, want it to name rank 3", errs[0])
	}
}

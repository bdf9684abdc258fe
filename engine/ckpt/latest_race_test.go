package ckpt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLatestWhileAJobCommits: a running job commits step 2 and prunes step
// 1 (keep 1) while Latest is looking, after it skipped step 2 as not yet
// committed and before it reached step 1. Latest must look again and find
// step 2, not report that nothing is valid (gtrain resume --dry-run and
// ckpt ls beside a running job).
func TestLatestWhileAJobCommits(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 1, 1, 0)
	mustWrite(t, root, 2, 1, 0)
	manifest := filepath.Join(root, StepDirName(2), ManifestName)
	aside := filepath.Join(root, "manifest-of-step-2")
	if err := os.Rename(manifest, aside); err != nil {
		t.Fatal(err)
	}
	committed := false
	warn := func(msg string) {
		if committed || !strings.Contains(msg, StepDirName(2)) {
			return
		}
		// The job's commit of step 2, then its pruning of step 1.
		committed = true
		if err := os.Rename(aside, manifest); err != nil {
			t.Error(err)
		}
		if err := os.RemoveAll(filepath.Join(root, StepDirName(1))); err != nil {
			t.Error(err)
		}
	}
	c, err := Latest(t.Context(), root, warn)
	if !committed {
		t.Fatal("Latest never skipped the uncommitted step 2: the race was not set up")
	}
	if err != nil || c.Manifest.Step != 2 {
		t.Fatalf("Latest = %v, %v; want step 2, committed while Latest looked", c, err)
	}
}

package ckpt

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestResolve tells step directories from roots, whichever way they are
// spelt.
func TestResolve(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 100, 1, 0)
	mustWrite(t, root, 200, 1, 0)
	step := filepath.Join(root, StepDirName(100))
	// A committed checkpoint copied under another name is known by its
	// manifest; an uncommitted step directory by its name.
	copied := filepath.Join(root, "best")
	must(t, os.Rename(filepath.Join(root, StepDirName(200)), copied))
	uncommitted := filepath.Join(root, StepDirName(300))
	must(t, os.Mkdir(uncommitted, 0o755))
	file := filepath.Join(root, "notes.txt")
	must(t, os.WriteFile(file, nil, 0o644))
	t.Chdir(step)

	for _, tc := range []struct {
		name, path string
		want       Target
		err        error
	}{
		{"root", root, Target{Root: root}, nil},
		{"root with a slash", root + "/", Target{Root: root}, nil},
		{"step directory", step, Target{Root: root, Step: step}, nil},
		{"step directory with a slash", step + "/", Target{Root: root, Step: step}, nil},
		{"the step directory itself, relative", ".", Target{Root: "..", Step: "."}, nil},
		{"its root, relative", "..", Target{Root: ".."}, nil},
		{"checkpoint under another name", copied, Target{Root: root, Step: copied}, nil},
		{"uncommitted step directory", uncommitted, Target{Root: root, Step: uncommitted}, nil},
		{"missing", filepath.Join(root, "nope"), Target{}, fs.ErrNotExist},
		{"missing step directory", filepath.Join(root, StepDirName(400)), Target{}, fs.ErrNotExist},
		{"a file", file, Target{}, ErrNotDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(tc.path)
			if !errors.Is(err, tc.err) || (tc.err != nil) != (err != nil) {
				t.Fatalf("Resolve(%q): error %v, want %v", tc.path, err, tc.err)
			}
			if got != tc.want {
				t.Errorf("Resolve(%q) = %+v, want %+v", tc.path, got, tc.want)
			}
		})
	}
}

// TestTargetLoad loads the step asked for, or the newest of a root.
func TestTargetLoad(t *testing.T) {
	root := t.TempDir()
	for _, s := range []int64{1, 2, 3} {
		mustWrite(t, root, s, 2, 0)
	}
	for path, want := range map[string]int64{root: 3, filepath.Join(root, StepDirName(2)): 2, filepath.Join(root, StepDirName(1)): 1} {
		tg, err := Resolve(path)
		must(t, err)
		c, err := tg.Load(t.Context(), nil)
		if err != nil || c.Step() != want {
			t.Errorf("%s: loaded %v, %v; want step %d", path, c, err, want)
		}
	}
	flip(t, filepath.Join(root, StepDirName(3), RankFileName(1)), -1)
	tg, _ := Resolve(filepath.Join(root, StepDirName(3)))
	if _, err := tg.Load(t.Context(), nil); !errors.As(err, new(*InvalidError)) {
		t.Errorf("a damaged step asked for by name: %v, want *InvalidError (never an older one instead)", err)
	}
}

// TestSetAside moves the newer step directories, valid or not, out of the
// root into one new directory per call, and leaves the older ones.
func TestSetAside(t *testing.T) {
	root := t.TempDir()
	for _, s := range []int64{1, 2, 3} {
		mustWrite(t, root, s, 1, 0)
	}
	must(t, os.Mkdir(filepath.Join(root, StepDirName(4)), 0o755)) // an interrupted write
	now := time.Date(2026, 11, 22, 19, 30, 12, 0, time.UTC)
	dest, moved, err := SetAside(root, 1, now)
	must(t, err)
	if want := []string{StepDirName(2), StepDirName(3), StepDirName(4)}; !slices.Equal(moved, want) {
		t.Errorf("moved %v, want %v", moved, want)
	}
	if want := filepath.Join(root, "superseded-20261122-193012"); dest != want {
		t.Errorf("moved to %s, want %s", dest, want)
	}
	if got := stepsIn(t, root); !slices.Equal(got, []int64{1}) {
		t.Errorf("steps left in the root: %v, want [1]", got)
	}
	if c, err := Latest(t.Context(), root, nil); err != nil || c.Step() != 1 {
		t.Errorf("Latest after SetAside: %v, %v", c, err)
	}
	if c, err := Open(t.Context(), filepath.Join(dest, StepDirName(3))); err != nil || c.Step() != 3 {
		t.Errorf("the checkpoint set aside no longer opens: %v", err)
	}
	// Nothing newer: nothing moved, nothing created. Something newer again
	// in the same second: a directory of its own.
	if dest, moved, err := SetAside(root, 1, now); dest != "" || moved != nil || err != nil {
		t.Errorf("SetAside with nothing newer: %q %v %v", dest, moved, err)
	}
	mustWrite(t, root, 2, 1, 0)
	dest2, _, err := SetAside(root, 1, now)
	must(t, err)
	if dest2 == dest || dest2 == "" {
		t.Errorf("a second SetAside in the same second used %q (the first: %q)", dest2, dest)
	}
}

// TestMkdirUnique: the same name asked for twice gives two directories.
func TestMkdirUnique(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "runs")
	a, err := MkdirUnique(parent, "x")
	must(t, err)
	b, err := MkdirUnique(parent, "x")
	must(t, err)
	if a != filepath.Join(parent, "x") || b != filepath.Join(parent, "x-2") {
		t.Errorf("got %s and %s, want x and x-2 under %s", a, b, parent)
	}
}

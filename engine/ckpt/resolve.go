package ckpt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Target is what a path given to gtrain for a checkpoint names: a root of
// step directories (a job's checkpoint.dir), or one step directory of it.
type Target struct {
	Root string // the checkpoint directory
	Step string // the step directory; "" when the path names the root
}

// ErrNotDir is the cause of Resolve's error for a path that is a file.
var ErrNotDir = errors.New("not a directory: give a checkpoint directory or one of its step directories")

// Resolve tells a step directory from a root of them. A path is a step
// directory when its name is a step directory's (step-00000100) or when it
// holds a manifest (a checkpoint copied under another name); its root is
// then its parent. gtrain prints step directories ("saved ...", "resuming
// from ..."), so every command that takes a root takes one of them too. A
// path that does not exist gives an error wrapping fs.ErrNotExist, a file
// one wrapping ErrNotDir.
func Resolve(path string) (Target, error) {
	clean := filepath.Clean(path)
	st, err := os.Stat(clean)
	if err != nil {
		return Target{}, fmt.Errorf("ckpt: %w", err)
	}
	if !st.IsDir() {
		return Target{}, fmt.Errorf("ckpt: %s: %w", path, ErrNotDir)
	}
	if _, ok := ParseStepDir(filepath.Base(clean)); ok {
		return Target{Root: filepath.Join(clean, ".."), Step: clean}, nil
	}
	_, err = os.Stat(filepath.Join(clean, ManifestName))
	switch {
	case err == nil:
		return Target{Root: filepath.Join(clean, ".."), Step: clean}, nil
	case errors.Is(err, fs.ErrNotExist):
		return Target{Root: clean}, nil
	default:
		return Target{}, fmt.Errorf("ckpt: %w", err)
	}
}

// Load is the checkpoint t names: the step directory's, verified, or the
// newest valid one of the root (see Latest; warn hears of the newer ones
// skipped). It stops when ctx ends, as Open does.
func (t Target) Load(ctx context.Context, warn func(string)) (*Checkpoint, error) {
	if t.Step != "" {
		return Open(ctx, t.Step)
	}
	return Latest(ctx, t.Root, warn)
}

// SupersededPrefix begins the name of the directories SetAside moves step
// directories into. They are no step directories: List, Latest and prune
// never look inside.
const SupersededPrefix = "superseded-"

// SetAside moves every step directory of root newer than step into a new
// directory root/superseded-<time>: a run resumed from an older checkpoint
// would otherwise write its steps among those of the abandoned history,
// and a later resume take the newest of either. It returns the new
// directory and the names moved; with nothing newer it creates nothing.
func SetAside(root string, step int64, now time.Time) (string, []string, error) {
	steps, err := stepDirs(root)
	if err != nil {
		return "", nil, err
	}
	var newer []stepDir
	for _, s := range steps {
		if s.step > step {
			newer = append(newer, s)
		}
	}
	if len(newer) == 0 {
		return "", nil, nil
	}
	dest, err := MkdirUnique(root, SupersededPrefix+now.Format("20060102-150405"))
	if err != nil {
		return "", nil, err
	}
	var moved []string
	for _, s := range newer {
		name := filepath.Base(s.path)
		if err := os.Rename(s.path, filepath.Join(dest, name)); err != nil {
			return dest, moved, fmt.Errorf("ckpt: set %s aside: %w", name, err)
		}
		moved = append(moved, name)
	}
	if err := syncDir(root); err != nil {
		return dest, moved, fmt.Errorf("ckpt: %w", err)
	}
	return dest, moved, nil
}

// maxUnique bounds MkdirUnique's suffixes.
const maxUnique = 10000

// MkdirUnique creates a new directory parent/base, or parent/base-2,
// parent/base-3, ... when that exists, and returns it. os.Mkdir fails on an
// existing name, so two processes choosing a name at the same moment never
// get the same directory.
func MkdirUnique(parent, base string) (string, error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("ckpt: %w", err)
	}
	dir := filepath.Join(parent, base)
	for i := 2; i < maxUnique; i++ {
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("ckpt: %w", err)
		}
		dir = filepath.Join(parent, fmt.Sprintf("%s-%d", base, i))
	}
	return "", fmt.Errorf("ckpt: %s: %d directories of that name exist already", filepath.Join(parent, base), maxUnique)
}

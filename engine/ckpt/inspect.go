package ckpt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/gtrain/gtrain/internal/usage"
)

// The functions here take a path as a user gave it to a gtrain command (op,
// such as "ckpt ls" or "resume", begins their errors): a path that is no
// directory is a usage error, and an interrupted command says only that.

// invalidHint is said once, after the reason a checkpoint is invalid.
const invalidHint = "an invalid checkpoint is never loaded (resume takes the newest valid one): delete its directory, or restore it from a copy"

// ResolveArg is Resolve for a path the user gave to the command op: a path
// that does not exist, or is no directory, is a *usage.Error naming op and
// path.
func ResolveArg(op, path string) (Target, error) {
	t, err := Resolve(path)
	if errors.Is(err, fs.ErrNotExist) {
		return t, usage.Errorf("%s: %s: no such directory", op, path)
	}
	if errors.Is(err, ErrNotDir) {
		return t, usage.Errorf("%s: %s: %w", op, path, ErrNotDir)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		// A loop of links, a directory it may not enter: the path the
		// user named cannot be used, as a missing one.
		return t, usage.Errorf("%s: %s: %w", op, path, pe.Err)
	}
	if err != nil {
		return t, fmt.Errorf("%s: %w", op, err)
	}
	return t, nil
}

// Inventory is what Inspect found at a path: the step directories there,
// oldest first, each verified as a resume would.
type Inventory struct {
	Path        string // as the user gave it
	Checkpoints []Info
}

// Inspect verifies, for the command op, the step directory path, or every
// step directory under the root path (see Describe). A path that is no
// directory is a usage error (see ResolveArg). When ctx ends, the error is
// ctx's cause alone.
func Inspect(ctx context.Context, op, path string) (Inventory, error) {
	inv := Inventory{Path: path}
	t, err := ResolveArg(op, path)
	if err != nil {
		return inv, err
	}
	if t.Step != "" {
		info, err := Describe(ctx, t.Step)
		if err != nil {
			return inv, interruptedOr(ctx, fmt.Errorf("%s: %w", op, err))
		}
		inv.Checkpoints = []Info{info}
		return inv, nil
	}
	if inv.Checkpoints, err = List(ctx, t.Root); err != nil {
		return inv, interruptedOr(ctx, fmt.Errorf("%s: %w", op, err))
	}
	return inv, nil
}

// Latest is the index of the newest valid checkpoint, the one a resume from
// the path would load; -1 without one.
func (v Inventory) Latest() int {
	for i := len(v.Checkpoints) - 1; i >= 0; i-- {
		if v.Checkpoints[i].Valid {
			return i
		}
	}
	return -1
}

// NumValid is the number of valid checkpoints.
func (v Inventory) NumValid() int {
	n := 0
	for _, info := range v.Checkpoints {
		if info.Valid {
			n++
		}
	}
	return n
}

// Check is the verdict of the command op on the inventory: nil when it
// holds checkpoints and all are valid; else an error saying there are none,
// or naming the first invalid one and how many are.
func (v Inventory) Check(op string) error {
	var bad []Info
	for _, info := range v.Checkpoints {
		if !info.Valid {
			bad = append(bad, info)
		}
	}
	switch {
	case len(v.Checkpoints) == 0:
		return fmt.Errorf("%s: no checkpoints in %s", op, v.Path)
	case len(bad) == 0:
		return nil
	}
	first := fmt.Sprintf("%s: %s", filepath.Base(bad[0].Dir), bad[0].Reason)
	if len(v.Checkpoints) == 1 {
		return fmt.Errorf("%s: %s; %s", op, first, invalidHint)
	}
	return fmt.Errorf("%s: %d of %d checkpoints invalid, first %s; %s", op, len(bad), len(v.Checkpoints), first, invalidHint)
}

// interruptedOr is err, or ctx's cause alone when ctx has ended: an
// interrupted command says only that ("gtrain: interrupted by SIGINT"), not
// which file it was reading.
func interruptedOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

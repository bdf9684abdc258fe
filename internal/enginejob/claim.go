package enginejob

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/launch"
)

// claim is the launcher's hold on a job's checkpoint directory.
type claim struct {
	dir  string
	lock *ckpt.DirLock // nil when not taken (dry run, hostfile)
	// created is the topmost directory the launcher created for dir
	// (dir or an ancestor); "" when dir existed.
	created string
	warn    func(string)
}

// claimDir makes the launcher the one writer of the checkpoint directory
// dir for the whole job, restarts included, before any rank starts: it
// creates dir, takes its lock (ckpt.Lock: another job's gives a
// *ckpt.LockedError naming it) and checks that it can write there. Only
// for a job on this machine alone (no hostfile): a hostfile's hosts may
// see another directory of that name, or none, and there rank 0 of the
// engine does the same before the first step. A dry run claims nothing.
// created is the directory the caller already created for dir, if any;
// hint says what to do about a directory that cannot be used. It returns
// the claim and the run id the lock names ("" when none was taken).
func claimDir(o Options, dir, created, hint string) (*claim, string, error) {
	c := &claim{dir: dir, created: created, warn: o.warn}
	if o.DryRun || o.Hostfile {
		return c, "", nil
	}
	if c.created == "" {
		c.created = missingFrom(dir)
	}
	runID := o.RunID
	if runID == "" {
		runID = launch.NewRunID() // the job's, to be named in the lock
	}
	lock, err := ckpt.Lock(dir, ckpt.ThisProcess(runID, ownerCommand(o.Args)))
	if err == nil {
		c.lock = lock
		err = ckpt.CheckWritable(dir)
	}
	if err != nil {
		c.release()
		if errors.As(err, new(*ckpt.LockedError)) {
			return nil, "", err // says what to do
		}
		return nil, "", fmt.Errorf("%w; %s", err, hint)
	}
	return c, runID, nil
}

// release gives the lock up. A directory the launcher created and no
// checkpoint was written to is removed first: a job that failed before its
// first checkpoint leaves nothing behind.
func (c *claim) release() {
	switch {
	case c.created == "":
	case c.lock == nil:
		removeEmptyUpTo(c.dir, c.created)
	default:
		// Only the holder may remove the lock files.
		if removed, _ := ckpt.RemoveUnused(c.dir); removed {
			removeEmptyUpTo(filepath.Dir(c.dir), c.created)
		}
	}
	if err := c.lock.Unlock(); err != nil {
		c.warn(fmt.Sprintf("unlock %s: %v", c.dir, err))
	}
}

// missingFrom is the topmost directory of path, path itself or one of its
// ancestors, that does not exist; "" when path exists.
func missingFrom(path string) string {
	top := ""
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			return top
		}
		top = p
		if filepath.Dir(p) == p {
			return top
		}
	}
}

// removeEmptyUpTo removes dir and its ancestors up to top, as long as they
// are empty; top must be dir or one of its ancestors.
func removeEmptyUpTo(dir, top string) {
	if dir != top && !strings.HasPrefix(dir, top+string(filepath.Separator)) {
		return
	}
	for p := dir; ; p = filepath.Dir(p) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return
		}
		if p == top || filepath.Dir(p) == p {
			return
		}
	}
}

// ownerCommand is the command line recorded in a lock file, which others
// may read: the values of --env are left out.
func ownerCommand(args []string) string {
	out := []string{"gtrain"}
	hide := func(kv string) string { k, _, _ := strings.Cut(kv, "="); return k + "=…" }
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--env" && i+1 < len(args):
			out = append(out, a, hide(args[i+1]))
			i++
			continue
		case strings.HasPrefix(a, "--env="):
			a = "--env=" + hide(strings.TrimPrefix(a, "--env="))
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

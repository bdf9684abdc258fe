package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LockName is the lock file the launcher holds in a checkpoint directory
// for the whole life of a job, across its restarts.
const LockName = ".gtrain.lock"

// WriterLockName is the lock file rank 0 of the engine holds while it
// trains: two launchers on different machines that share the directory
// through a network file system still cannot both write to it.
const WriterLockName = ".gtrain-writer.lock"

// maxOwnerBytes bounds what is read of a lock file's owner record; a real
// one is a few hundred bytes.
const maxOwnerBytes = 64 << 10

// maxOwnerCommand bounds the command recorded in a lock file.
const maxOwnerCommand = 512

// LockOwner is who holds a checkpoint directory's lock, recorded in the
// lock file so that a job refused the directory can name the one that has
// it.
type LockOwner struct {
	RunID   string    `json:"run_id,omitempty"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Since   time.Time `json:"since"`
	Command string    `json:"command,omitempty"`
}

// ThisProcess is the owner record of this process, of the job runID,
// running command (the program's name when empty). The lock file is
// readable by others: command should hold nothing secret.
func ThisProcess(runID, command string) LockOwner {
	host, _ := os.Hostname()
	if command == "" && len(os.Args) > 0 {
		command = filepath.Base(os.Args[0])
	}
	if len(command) > maxOwnerCommand {
		command = command[:maxOwnerCommand] + "…"
	}
	return LockOwner{RunID: runID, Host: host, PID: os.Getpid(), Since: time.Now(), Command: command}
}

// LockedError says that another job holds a checkpoint directory's lock.
type LockedError struct {
	Dir   string    // the checkpoint directory
	File  string    // the lock file, LockName or WriterLockName
	Owner LockOwner // as the holder recorded itself; zero when it has not (yet)
}

// Error names the other job and says what to do.
func (e *LockedError) Error() string {
	return fmt.Sprintf("ckpt: lock %s: the directory is in use by %s; a checkpoint directory has one writer at a time: wait for that job to end or stop it, or set another checkpoint.dir",
		e.Dir, e.Owner.describe())
}

// Describe is the owner in words, as describe gives them.
func (o LockOwner) Describe() string { return o.describe() }

// describe is the owner in words: "gtrain job 1b4e… (pid 4242 on node-1,
// since 2026-11-22 19:30:12: "gtrain run --job j.yaml")".
func (o LockOwner) describe() string {
	if o.PID <= 0 {
		return "another gtrain job (it has not recorded itself yet)"
	}
	var b strings.Builder
	b.WriteString("another gtrain job")
	if o.RunID != "" {
		fmt.Fprintf(&b, " %q", o.RunID)
	}
	fmt.Fprintf(&b, " (pid %d on %q, since %s", o.PID, o.Host, o.Since.Local().Format("2006-01-02 15:04:05"))
	if o.Command != "" {
		fmt.Fprintf(&b, ": %q", o.Command)
	}
	b.WriteString(")")
	return b.String()
}

// DirLock is a held lock of a checkpoint directory.
type DirLock struct {
	f *os.File
}

// Lock takes the launcher's exclusive lock of the checkpoint directory
// dir (DIR/.gtrain.lock), creating dir if needed, and records owner in it.
// The lock is flock(2), which the kernel releases when the process ends
// however it ends, SIGKILL included: no stale lock is ever left. A lock
// held by another process gives a *LockedError naming it.
func Lock(dir string, owner LockOwner) (*DirLock, error) {
	return lockFile(dir, LockName, owner)
}

// LockWriter takes the engine's writer lock of dir (DIR/.gtrain-writer.lock)
// as Lock takes the launcher's.
func LockWriter(dir string, owner LockOwner) (*DirLock, error) {
	return lockFile(dir, WriterLockName, owner)
}

func lockFile(dir, name string, owner LockOwner) (*DirLock, error) {
	fail := func(err error) error { return fmt.Errorf("ckpt: lock %s: %w", dir, err) }
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fail(err)
	}
	path := filepath.Join(dir, name)
	// Someone may delete the file between our open and our flock, and a
	// second job then lock a new file of the same name: only a lock on the
	// file that is still at path counts. Bounded, though it never loops in
	// practice.
	for range 10 {
		// os.OpenFile sets O_CLOEXEC: the ranks and agents the launcher
		// starts must not inherit the lock and keep it after it dies.
		// O_NONBLOCK: a FIFO planted under the name must not hang the open.
		// O_NOFOLLOW: a symbolic link must not make us empty its target
		// when the lock is released.
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0o644)
		if errors.Is(err, unix.ELOOP) {
			return nil, fail(fmt.Errorf("%s is a symbolic link, not a regular file: remove it", path))
		}
		if err != nil {
			return nil, fail(err)
		}
		if err := regular(f); err != nil {
			f.Close()
			return nil, fail(err)
		}
		if err := flock(f); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, &LockedError{Dir: dir, File: name, Owner: readOwner(path)}
			}
			return nil, fail(fmt.Errorf("flock %s: %w", path, err))
		}
		if same, err := samePath(f, path); err != nil || !same {
			f.Close()
			if err != nil {
				return nil, fail(err)
			}
			continue
		}
		l := &DirLock{f: f}
		if err := l.record(owner); err != nil {
			f.Close()
			return nil, fail(fmt.Errorf("record the owner in %s: %w", path, err))
		}
		return l, nil
	}
	return nil, fail(fmt.Errorf("%s keeps being replaced while it is locked: is another program deleting it?", path))
}

// regular refuses a lock file that is not a regular file (a device, a
// FIFO, a directory): it could not hold the owner record.
func regular(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s): remove it", f.Name(), st.Mode().Type())
	}
	return nil
}

// flock takes an exclusive lock of f without waiting.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// samePath reports whether the open file f is still the file at path.
func samePath(f *os.File, path string) (bool, error) {
	a, err := f.Stat()
	if err != nil {
		return false, err
	}
	b, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(a, b), nil
}

// record replaces the owner record in the lock file.
func (l *DirLock) record(owner LockOwner) error {
	b, err := json.Marshal(owner)
	if err != nil {
		return err
	}
	if err := l.f.Truncate(0); err != nil {
		return err
	}
	_, err = l.f.WriteAt(append(b, '\n'), 0)
	return err
}

// readOwner is the owner recorded in the lock file at path; zero when it
// cannot be read or parsed (a holder between its flock and its record).
func readOwner(path string) LockOwner {
	var o LockOwner
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return o
	}
	defer f.Close()
	if regular(f) != nil {
		return o
	}
	b, err := io.ReadAll(io.LimitReader(f, maxOwnerBytes))
	if err != nil || json.Unmarshal(b, &o) != nil {
		return LockOwner{}
	}
	if len(o.Command) > maxOwnerCommand {
		o.Command = o.Command[:maxOwnerCommand] + "…"
	}
	return o
}

// Unlock releases the lock. The lock file stays (removing it would let a
// job that opened it before the removal lock a file no one else sees); its
// owner record is cleared so that it names no one.
func (l *DirLock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	terr := l.f.Truncate(0)
	err := l.f.Close() // closing the last descriptor releases the flock
	l.f = nil
	if err == nil {
		err = terr
	}
	return err
}

// CheckWritable checks that files can be created in dir, by creating and
// removing a temporary one: an unwritable checkpoint directory must fail a
// job before its first step, not at its first checkpoint.
func CheckWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".gtrain-probe"+tempMarker+"*")
	if err != nil {
		return fmt.Errorf("ckpt: %s is not writable: %w", dir, err)
	}
	name := f.Name()
	err = f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("ckpt: %s: %w", dir, err)
	}
	return nil
}

// RemoveUnused removes dir when it holds nothing but gtrain's lock files:
// a checkpoint directory that a job created and never wrote to, which must
// not be left behind. Call it while holding the lock (the lock's own check
// that its file is still in place makes the removal safe for a job that
// opened the file just before). It reports whether dir was removed.
func RemoveUnused(dir string) (bool, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("ckpt: %w", err)
	}
	for _, e := range ents {
		if e.Name() != LockName && e.Name() != WriterLockName {
			return false, nil
		}
	}
	for _, e := range ents {
		if err := removeIfExists(filepath.Join(dir, e.Name())); err != nil {
			return false, fmt.Errorf("ckpt: %w", err)
		}
	}
	if err := os.Remove(dir); err != nil {
		return false, fmt.Errorf("ckpt: %w", err)
	}
	return true, nil
}

package launch

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gtrain/gtrain/internal/userfile"
	"golang.org/x/sys/unix"
)

// An agent's temporary directory (gtrain-RUN-*, with the store secret) is
// removed by the agent as it exits, but an agent killed by SIGKILL or the
// OOM killer never gets to. So each agent holds an exclusive flock(2) on
// agentLockName in its directory for as long as it lives, and an agent
// making its directory sweeps the others: one whose lock it can take
// belongs to a dead agent, and goes. The kernel drops the lock with the
// process, however it died; the file is opened O_CLOEXEC, so no rank
// inherits it and keeps a dead agent's lock alive.
const (
	agentLockName = "agent.lock"
	// tmpPrefix begins every name the sweep considers; the lock file, not
	// the name, decides (gtrain-known_hosts-* has none, nor what older
	// agents or other programs made).
	tmpPrefix = "gtrain-"
	// sweepMaxNames and sweepMaxDirs bound one sweep in a crowded TMPDIR:
	// the names read, and the gtrain-* entries looked at.
	sweepMaxNames = 1 << 16
	sweepMaxDirs  = 4096
)

// lockTmp takes the liveness lock in dir, the agent's new directory, and
// returns the file that holds it: the lock lasts until the file is closed.
// The file is made and locked under another name and only then renamed to
// agentLockName, so that a sweeping agent never finds agentLockName
// unlocked while its agent lives. The file names this host: a TMPDIR that
// several hosts share (NFS without working locks) is swept only of what
// this host's agents left.
func lockTmp(dir string) (*os.File, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, agentLockName+".new")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err = flock(f, unix.LOCK_EX|unix.LOCK_NB); err == nil {
		if _, err = f.WriteString(host + "\n"); err == nil {
			err = os.Rename(tmp, filepath.Join(dir, agentLockName))
		}
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	return f, nil
}

// flock applies op to f's open file description.
func flock(f *os.File, op int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = unix.Flock(int(fd), op) }); err != nil {
		return err
	}
	if ferr != nil {
		return &os.PathError{Op: "flock", Path: f.Name(), Err: ferr}
	}
	return nil
}

// sweepTmp removes from parent (the agent's TMPDIR) the directories of
// this user's agents on this host that died without removing them, but
// never keep, the caller's own. It is housekeeping: what it cannot read,
// lock or remove it leaves, and it never fails. It returns what it removed.
func sweepTmp(parent, keep string) []string {
	return sweepDirs(parent, keep, sweepMaxNames, sweepMaxDirs)
}

// sweepDirs is sweepTmp within the given bounds.
func sweepDirs(parent, keep string, maxNames, maxDirs int) []string {
	host, err := os.Hostname()
	if err != nil {
		return nil
	}
	var removed []string
	// All listed before any is removed: a directory changing under a
	// reader may skip names.
	for _, name := range userfile.Names(parent, tmpPrefix, maxNames, maxDirs) {
		path := filepath.Join(parent, name)
		if path != filepath.Clean(keep) && removeIfDead(path, os.Getuid(), host) {
			removed = append(removed, path)
		}
	}
	return removed
}

// removeIfDead removes path if it is a real directory owned by uid whose
// agentLockName is a regular file of uid's, names host, and can be
// locked: its agent is dead. Anything else (a symbolic link, a FIFO, a
// directory without the lock, a lock held) is left alone.
func removeIfDead(path string, uid int, host string) bool {
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() || !ownedBy(fi, uid) {
		return false
	}
	lock := filepath.Join(path, agentLockName)
	// O_NOFOLLOW: a symbolic link is not followed to a lock elsewhere;
	// O_NONBLOCK: a FIFO does not hang the open; O_RDWR: NFS emulates
	// flock with POSIX locks, whose exclusive kind needs a writable file.
	fd, err := unix.Open(lock, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	// Closed, and the lock dropped, only after the removal.
	f := os.NewFile(uintptr(fd), lock)
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || !ownedBy(st, uid) || !namesHost(f, host) {
		return false
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false // EWOULDBLOCK: its agent lives
	}
	// An agent removes its directory before it lets go of the lock: a
	// lock file no longer at its path was being removed with its
	// directory when this sweep opened it.
	if now, err := os.Lstat(lock); err != nil || !os.SameFile(st, now) {
		return false
	}
	return os.RemoveAll(path) == nil
}

// ownedBy reports whether fi's owner is uid.
func ownedBy(fi os.FileInfo, uid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == uid
}

// namesHost reports whether the lock file f says it was made on host.
func namesHost(f *os.File, host string) bool {
	b := make([]byte, 256)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return false
	}
	return bytes.Equal(bytes.TrimSuffix(b[:n], []byte("\n")), []byte(host))
}

package ckpt

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// procLocks is the kernel's table of file locks (proc(5)); a variable for
// tests.
var procLocks = "/proc/locks"

// maxLockLines bounds what Holder reads of procLocks.
const maxLockLines = 1 << 16

// Holder reports whether a process holds the launcher's or the engine's
// lock of the checkpoint directory dir (Lock, LockWriter), and who, as the
// holder recorded itself, without taking either lock: it looks for the
// lock file's flock(2) in the kernel's table. It sees locks taken on this
// machine only, and says false where it cannot tell.
func Holder(dir string) (LockOwner, bool) {
	for _, name := range []string{LockName, WriterLockName} {
		path := filepath.Join(dir, name)
		st, err := os.Lstat(path)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		if held, _ := flocked(uint64(sys.Dev), uint64(sys.Ino)); held {
			return readOwner(path), true
		}
	}
	return LockOwner{}, false
}

// flocked reports whether procLocks lists a held flock(2) of the file
// with device dev and inode ino. A line is "1: FLOCK  ADVISORY  WRITE
// 4242 fd:01:131 0 EOF"; a waiter's has "->" after the number.
func flocked(dev, ino uint64) (bool, error) {
	f, err := os.Open(procLocks)
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(dev), unix.Minor(dev), ino)
	sc := bufio.NewScanner(io.LimitReader(f, 256*maxLockLines))
	for n := 0; sc.Scan() && n < maxLockLines; n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" {
			continue // a waiter ("->"), or a POSIX or OFD lock
		}
		if fields[5] == want {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return false, err
	}
	return false, nil
}

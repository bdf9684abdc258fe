package ckpt

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lockChildEnv makes the test binary, re-executed by TestLockBetweenProcesses,
// a lock holder: its value is the directory to lock.
const lockChildEnv = "GTRAIN_CKPT_LOCK_CHILD"

// lockHolder is the child: it takes the lock of dir as job "run-A", says
// "locked", and holds it until its stdin closes or it is killed.
func lockHolder(dir string) {
	l, err := Lock(dir, ThisProcess("run-A", "gtrain run --job a.yaml"))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(3)
	}
	fmt.Println("locked")
	io.Copy(io.Discard, os.Stdin)
	l.Unlock()
}

// startHolder starts a lock holder of dir and waits until it holds the lock.
func startHolder(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockBetweenProcesses$")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "locked\n" {
		t.Fatalf("lock holder: %q", line)
	}
	return cmd
}

// TestLockBetweenProcesses: while another process holds a directory's lock,
// Lock fails with a *LockedError naming it (run id, pid, host, since, its
// command); once that process is SIGKILLed, which runs no code of its own,
// the lock is free.
func TestLockBetweenProcesses(t *testing.T) {
	if dir := os.Getenv(lockChildEnv); dir != "" {
		lockHolder(dir)
		return
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	before := time.Now().Add(-time.Second)
	holder := startHolder(t, dir)

	_, err := Lock(dir, ThisProcess("run-B", ""))
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("Lock while another process holds it: %v, want a *LockedError", err)
	}
	host, _ := os.Hostname()
	o := le.Owner
	if o.RunID != "run-A" || o.PID != holder.Process.Pid || o.Host != host || o.Since.Before(before) || o.Command != "gtrain run --job a.yaml" {
		t.Errorf("owner %+v, want run-A, pid %d on %s since about now", o, holder.Process.Pid, host)
	}
	msg := err.Error()
	for _, want := range []string{dir, `"run-A"`, "pid " + strconv.Itoa(holder.Process.Pid), host, "gtrain run --job a.yaml", "set another checkpoint.dir"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}

	must(t, holder.Process.Signal(syscall.SIGKILL))
	holder.Wait()
	l, err := Lock(dir, ThisProcess("run-B", ""))
	if err != nil {
		t.Fatalf("Lock after the holder was SIGKILLed: %v", err)
	}
	must(t, l.Unlock())
}

// TestLockInProcess: two locks of one directory exclude each other within
// a process too (flock locks open files), the launcher's and the writer's
// locks are independent, and Unlock frees the lock and clears the owner.
func TestLockInProcess(t *testing.T) {
	dir := t.TempDir()
	a, err := Lock(dir, ThisProcess("a", ""))
	must(t, err)
	w, err := LockWriter(dir, ThisProcess("a", ""))
	must(t, err)
	if _, err := Lock(dir, ThisProcess("b", "")); !errors.As(err, new(*LockedError)) {
		t.Fatalf("second Lock: %v, want *LockedError", err)
	}
	if _, err := LockWriter(dir, ThisProcess("b", "")); !errors.As(err, new(*LockedError)) {
		t.Fatalf("second LockWriter: %v, want *LockedError", err)
	}
	must(t, a.Unlock())
	must(t, w.Unlock())
	if o := readOwner(filepath.Join(dir, LockName)); o.PID != 0 {
		t.Errorf("owner %+v still recorded after Unlock", o)
	}
	b, err := Lock(dir, ThisProcess("b", ""))
	must(t, err)
	must(t, b.Unlock())
}

// TestLockedErrorUnknownOwner: a lock file without an owner record (a
// holder between its flock and its record, or garbage) still gives a
// clear message.
func TestLockedErrorUnknownOwner(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, LockName), []byte("\x00garbage"), 0o644))
	err := &LockedError{Dir: dir, File: LockName, Owner: readOwner(filepath.Join(dir, LockName))}
	if msg := err.Error(); !strings.Contains(msg, "another gtrain job (it has not recorded itself yet)") || !strings.Contains(msg, dir) {
		t.Errorf("message %q", msg)
	}
}

// TestLockFilesAreNoCheckpoints: the lock files and the probe of
// CheckWritable beside the step directories are never listed, loaded or
// pruned, and pruning leaves the locks held.
func TestLockFilesAreNoCheckpoints(t *testing.T) {
	root := t.TempDir()
	a, err := Lock(root, ThisProcess("a", ""))
	must(t, err)
	defer a.Unlock()
	w, err := LockWriter(root, ThisProcess("a", ""))
	must(t, err)
	defer w.Unlock()
	must(t, CheckWritable(root))
	for step := int64(1); step <= 3; step++ {
		mustWrite(t, root, step, 2, 1)
	}
	infos, err := List(t.Context(), root)
	must(t, err)
	if len(infos) != 1 || infos[0].Step != 3 || !infos[0].Valid {
		t.Errorf("List: %+v, want step 3 only", infos)
	}
	if c, err := Latest(t.Context(), root, nil); err != nil || c.Step() != 3 {
		t.Errorf("Latest: %v, %v", c, err)
	}
	ents, err := os.ReadDir(root)
	must(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{WriterLockName, LockName, StepDirName(3)}; !slices.Equal(names, want) { // ReadDir sorts
		t.Errorf("root holds %v, want %v", names, want)
	}
	if _, err := Lock(root, ThisProcess("b", "")); !errors.As(err, new(*LockedError)) {
		t.Errorf("the lock is no longer held after pruning: %v", err)
	}
}

// TestLockUnusableDir: a checkpoint directory that cannot be created or
// written to fails naming it.
func TestLockUnusableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	must(t, os.WriteFile(file, nil, 0o644))
	dir := filepath.Join(file, "ckpt")
	if _, err := Lock(dir, ThisProcess("a", "")); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("Lock under a file: %v, want an error naming %s", err, dir)
	}
	if err := CheckWritable(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("CheckWritable under a file: %v, want an error naming %s", err, dir)
	}
	if os.Geteuid() == 0 {
		t.Skip("root writes to read-only directories")
	}
	ro := filepath.Join(t.TempDir(), "ro")
	must(t, os.Mkdir(ro, 0o555))
	if err := CheckWritable(ro); err == nil || !strings.Contains(err.Error(), ro) {
		t.Errorf("CheckWritable of a read-only directory: %v, want an error naming it", err)
	}
}

// TestRemoveUnused removes a directory that holds only lock files, and
// nothing else.
func TestRemoveUnused(t *testing.T) {
	root := t.TempDir()
	unused, used := filepath.Join(root, "unused"), filepath.Join(root, "used")
	for _, d := range []string{unused, used} {
		l, err := Lock(d, ThisProcess("a", ""))
		must(t, err)
		defer l.Unlock()
	}
	mustWrite(t, used, 1, 1, 0)
	if ok, err := RemoveUnused(unused); !ok || err != nil {
		t.Errorf("RemoveUnused of a directory with only its lock: %v, %v", ok, err)
	}
	if _, err := os.Stat(unused); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there: %v", unused, err)
	}
	if ok, err := RemoveUnused(used); ok || err != nil {
		t.Errorf("RemoveUnused of a directory with a checkpoint: %v, %v", ok, err)
	}
	if c, err := Latest(t.Context(), used, nil); err != nil || c.Step() != 1 {
		t.Errorf("the checkpoint is gone: %v, %v", c, err)
	}
}

// TestLockSpecialFile: a lock file that is a FIFO or a directory is
// refused at once, naming it, without hanging.
func TestLockSpecialFile(t *testing.T) {
	fifo, dir := t.TempDir(), t.TempDir()
	must(t, syscall.Mkfifo(filepath.Join(fifo, LockName), 0o644))
	must(t, os.Mkdir(filepath.Join(dir, LockName), 0o755))
	// A link to a file of the user's: locking must refuse it, and the
	// target must keep its bytes (a release empties the lock file).
	link := t.TempDir()
	target := filepath.Join(t.TempDir(), "precious")
	must(t, os.WriteFile(target, []byte("keep me"), 0o644))
	must(t, os.Symlink(target, filepath.Join(link, LockName)))
	for _, d := range []string{fifo, dir, link} {
		_, err := Lock(d, ThisProcess("a", ""))
		if err == nil || !strings.Contains(err.Error(), filepath.Join(d, LockName)) {
			t.Errorf("Lock with a special lock file: %v", err)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep me" {
		t.Errorf("the target of a linked lock file holds %q (%v), want it untouched", b, err)
	}
	if o := readOwner(filepath.Join(fifo, LockName)); o.PID != 0 {
		t.Errorf("owner read from a FIFO: %+v", o)
	}
}

// TestHolder: Holder names the process that holds a directory's lock,
// without taking it (the holder keeps it, and a Lock meanwhile is still
// refused); once the holder is gone, it reports none.
func TestHolder(t *testing.T) {
	dir := t.TempDir()
	if _, held := Holder(dir); held {
		t.Fatal("Holder of a directory without a lock file: held")
	}
	holder := startHolder(t, dir)
	owner, held := Holder(dir)
	if !held || owner.PID != holder.Process.Pid || owner.RunID != "run-A" {
		t.Fatalf("Holder = %+v, %v; want run-A, pid %d", owner, held, holder.Process.Pid)
	}
	if _, err := Lock(dir, ThisProcess("run-B", "")); !errors.As(err, new(*LockedError)) {
		t.Fatalf("Lock after Holder: %v, want *LockedError (Holder must not take the lock)", err)
	}
	must(t, holder.Process.Kill())
	holder.Wait()
	if owner, held := Holder(dir); held {
		t.Errorf("Holder after the holder was killed = %+v, held", owner)
	}
	// Its own lock counts too: the table does not say whose a lock is.
	l, err := LockWriter(dir, ThisProcess("run-C", ""))
	must(t, err)
	defer l.Unlock()
	if owner, held := Holder(dir); !held || owner.RunID != "run-C" {
		t.Errorf("Holder with the writer lock taken = %+v, %v; want run-C", owner, held)
	}
}

// TestFlockedTable: flocked reads the kernel's table as proc(5) gives it,
// skipping waiters and other kinds of lock, and bounds what it reads.
func TestFlockedTable(t *testing.T) {
	table := filepath.Join(t.TempDir(), "locks")
	old := procLocks
	procLocks = table
	t.Cleanup(func() { procLocks = old })
	const ino = 131 // on device fd:01
	for _, tt := range []struct {
		name, text string
		want       bool
	}{
		{"held", "1: POSIX  ADVISORY  WRITE 7 fd:01:131 0 EOF\n2: FLOCK  ADVISORY  WRITE 4242 fd:01:131 0 EOF\n", true},
		{"other inode", "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1310 0 EOF\n", false},
		{"other device", "1: FLOCK  ADVISORY  WRITE 4242 fd:02:131 0 EOF\n", false},
		{"posix only", "1: POSIX  ADVISORY  WRITE 4242 fd:01:131 0 EOF\n", false},
		{"waiter only", "1: -> FLOCK  ADVISORY  WRITE 4243 fd:01:131 0 EOF\n", false},
		{"short lines", "garbage\n1:\n\n", false},
		{"one long line", strings.Repeat("x", 1<<20) + "\n2: FLOCK  ADVISORY  WRITE 4242 fd:01:131 0 EOF\n", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			must(t, os.WriteFile(table, []byte(tt.text), 0o644))
			if got, _ := flocked(unix.Mkdev(0xfd, 0x01), ino); got != tt.want {
				t.Errorf("flocked = %v, want %v", got, tt.want)
			}
		})
	}
}

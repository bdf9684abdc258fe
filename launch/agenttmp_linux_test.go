package launch

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gtrain/gtrain/launch/proto"
)

// deadAgentDir makes dir as an agent leaves it when killed: its lock file
// in place, unlocked, and a store secret.
func deadAgentDir(t *testing.T, dir string) {
	t.Helper()
	f := liveAgentDir(t, dir)
	f.Close()
}

// liveAgentDir makes dir as a live agent has it, and returns the file that
// holds its lock.
func liveAgentDir(t *testing.T, dir string) *os.File {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "attempt-0", "rank-0"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "store.secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := lockTmp(dir)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// tryLock reports whether path's lock can be taken through a new open file
// description (and lets it go at once).
func tryLock(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = flock(f, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil && !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatal(err)
	}
	return err == nil
}

// TestHelperHoldLock is not a test: run by holdLock in a child process,
// it holds the flock on GTRAIN_TEST_HOLD_LOCK until its stdin closes.
func TestHelperHoldLock(t *testing.T) {
	path := os.Getenv("GTRAIN_TEST_HOLD_LOCK")
	if path == "" {
		t.Skip("helper process for TestSweepTmp")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("locked\n")
	_, _ = io.Copy(io.Discard, os.Stdin)
	f.Close()
}

// holdLock has another process take path's lock, and returns once it has.
func holdLock(t *testing.T, path string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldLock$")
	cmd.Env = append(os.Environ(), "GTRAIN_TEST_HOLD_LOCK="+path, "GTRAIN_TEST_AGENT=")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	locked := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		locked <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-locked:
		if line != "locked\n" {
			t.Fatalf("lock holder said %q, want locked", line)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the lock holder did not take the lock within 30s")
	}
}

// TestLockTmp: the lock is in place under its own name only, excludes
// another open file description, and is not inherited by a child: a
// rank that outlives its agent does not keep the agent "alive".
func TestLockTmp(t *testing.T) {
	dir := t.TempDir()
	f, err := lockTmp(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := os.Lstat(filepath.Join(dir, agentLockName+".new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s.new still there (%v) after locking", agentLockName, err)
	}
	lock := filepath.Join(dir, agentLockName)
	if tryLock(t, lock) {
		t.Fatal("the lock could be taken while the agent holds it")
	}
	child := exec.Command("sleep", "300")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	f.Close()
	if !tryLock(t, lock) {
		t.Error("the lock is still held after the agent let go: a child inherited it")
	}
}

// TestSweepTmp: a sweep removes the directories of dead agents only. Live
// agents' (the lock held in this process through another open file
// description, or by another process), a symbolic link to a dead agent's
// directory, a FIFO, a file, a directory without the lock or with a lock
// that is no regular file, that names another host, or that is not yet
// in place, another program's, the caller's own, and anything not named
// gtrain-* are left alone.
func TestSweepTmp(t *testing.T) {
	elsewhere := t.TempDir()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	at := func(name string) string { return filepath.Join(tmp, name) }
	mkdir := func(path string) {
		if err := os.MkdirAll(path, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, data string) {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	deadAgentDir(t, at("gtrain-run-dead1"))
	deadAgentDir(t, at("gtrain-run-dead2"))
	here := liveAgentDir(t, at("gtrain-run-livehere"))
	defer here.Close()
	deadAgentDir(t, at("gtrain-run-liveproc"))
	holdLock(t, filepath.Join(at("gtrain-run-liveproc"), agentLockName))
	target := filepath.Join(elsewhere, "gtrain-target")
	deadAgentDir(t, target)
	if err := os.Symlink(target, at("gtrain-x")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(at("gtrain-fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	write(at("gtrain-file"), "a gtrain binary")
	mkdir(at("gtrain-old"))
	write(filepath.Join(at("gtrain-old"), "store.secret"), "older agents lock nothing")
	mkdir(at("gtrain-half"))
	write(filepath.Join(at("gtrain-half"), agentLockName+".new"), "")
	mkdir(at("gtrain-known_hosts-1"))
	write(filepath.Join(at("gtrain-known_hosts-1"), "known_hosts"), "")
	mkdir(at("gtrain-lockfifo"))
	if err := unix.Mkfifo(filepath.Join(at("gtrain-lockfifo"), agentLockName), 0o600); err != nil {
		t.Fatal(err)
	}
	mkdir(at("gtrain-locklink"))
	if err := os.Symlink(filepath.Join(target, agentLockName), filepath.Join(at("gtrain-locklink"), agentLockName)); err != nil {
		t.Fatal(err)
	}
	mkdir(at("gtrain-otherhost"))
	write(filepath.Join(at("gtrain-otherhost"), agentLockName), "elsewhere.invalid\n")
	deadAgentDir(t, at("gtrain-run-own"))
	deadAgentDir(t, at("other-dead"))
	if os.Getuid() == 0 { // only root can give a file away
		deadAgentDir(t, at("gtrain-nobody")) // another user's directory
		if err := os.Lchown(at("gtrain-nobody"), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		deadAgentDir(t, at("gtrain-nobodylock")) // another user's lock
		if err := os.Lchown(filepath.Join(at("gtrain-nobodylock"), agentLockName), 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	before, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}

	removed := sweepTmp(os.TempDir(), at("gtrain-run-own"))
	slices.Sort(removed)
	if want := []string{at("gtrain-run-dead1"), at("gtrain-run-dead2")}; !slices.Equal(removed, want) {
		t.Errorf("sweepTmp removed %v, want %v", removed, want)
	}
	for _, e := range before {
		_, err := os.Lstat(at(e.Name()))
		gone := errors.Is(err, os.ErrNotExist)
		if dead := strings.HasPrefix(e.Name(), "gtrain-run-dead"); gone != dead {
			t.Errorf("%s: gone %v (%v), want %v", e.Name(), gone, err, dead)
		}
	}
	if _, err := os.Stat(filepath.Join(target, "store.secret")); err != nil {
		t.Errorf("the symbolic link's target lost its secret: %v", err)
	}
	if tryLock(t, filepath.Join(at("gtrain-run-livehere"), agentLockName)) {
		t.Error("the live agent's lock was taken from it")
	}
}

// TestSweepTmpBounded: one sweep looks at no more than its bounds.
func TestSweepTmpBounded(t *testing.T) {
	tmp := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		deadAgentDir(t, filepath.Join(tmp, "gtrain-"+n))
	}
	if got := sweepDirs(tmp, "", 1<<16, 2); len(got) != 2 {
		t.Errorf("sweep of at most 2 directories removed %v", got)
	}
	if got := sweepDirs(tmp, "", 1, 10); len(got) != 1 {
		t.Errorf("sweep of at most 1 name removed %v", got)
	}
	if got := sweepDirs(tmp, "", 1<<16, 10); len(got) != 2 {
		t.Errorf("unbounded sweep removed %v, want the 2 left", got)
	}
}

// TestAgentKilledDirSwept: an agent killed with SIGKILL while its ranks
// run leaves its directory, with the store secret; the next agent to make
// its own directory in the same TMPDIR removes it before its ranks start.
func TestAgentKilledDirSwept(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var mu sync.Mutex
	var agentPID, ranks int
	var secret string
	rec := &recorder{on: func(ev proto.Event) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case ev.Type == proto.EventJoined && ev.Facts != nil:
			agentPID = ev.Facts.PID
		case ev.Type == proto.EventLog && strings.HasPrefix(ev.Line, "secret="):
			secret = strings.TrimPrefix(ev.Line, "secret=")
		case ev.Type == proto.EventLog && strings.HasPrefix(ev.Line, "pid="):
			if ranks++; ranks == 2 && agentPID > 0 {
				_ = syscall.Kill(agentPID, syscall.SIGKILL)
			}
		}
	}}
	_, err := runJobWith(t, t.Context(), 2, time.Second, nil, rec,
		`echo "secret=$GTRAIN_STORE_SECRET_FILE"; echo "pid=$$"; exec sleep 300`)
	var lost *AgentLostError
	if !errors.As(err, &lost) {
		t.Fatalf("Run error = %v, want *AgentLostError (agent pid %d killed after %d ranks)", err, agentPID, ranks)
	}
	stale := filepath.Dir(secret)
	if secret == "" || filepath.Dir(stale) != tmp {
		t.Fatalf("store secret %q, want a file in a directory of %s", secret, tmp)
	}
	for _, f := range []string{secret, filepath.Join(stale, agentLockName)} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("the killed agent's directory lacks %s: %v", filepath.Base(f), err)
		}
	}

	rec2, err := runJobWith(t, t.Context(), 1, time.Second, []string{"STALE=" + stale}, &recorder{},
		`if test -e "$STALE"; then echo stale-present; else echo stale-gone; fi`)
	if err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if got := rec2.lines(0); !slices.Equal(got, []string{"stale-gone"}) {
		t.Errorf("the second job's rank saw %v, want the killed agent's directory gone before it started", got)
	}
	if entries, err := os.ReadDir(tmp); err != nil || len(entries) != 0 {
		t.Errorf("TMPDIR holds %v (%v) after the second job", entries, err)
	}
}

package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/proctest"
)

// gtrainBin is the real gtrain binary TestMain built: teardown is about real
// processes, so these tests run the binary as a user would.
func gtrainBin(t *testing.T) string {
	t.Helper()
	if scriptBinDir == "" {
		t.Fatal("TestMain did not build gtrain")
	}
	return filepath.Join(scriptBinDir, "gtrain")
}

// job is a running `gtrain run` whose ranks print "pid=N" for every process
// they start.
type job struct {
	cmd  *exec.Cmd
	pids chan int
	done chan error
}

// startJob starts gtrain with args and collects the pids its ranks announce.
func startJob(t *testing.T, args ...string) *job {
	t.Helper()
	cmd := exec.Command(gtrainBin(t), args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	j := &job{cmd: cmd, pids: make(chan int, 64), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if _, v, ok := strings.Cut(sc.Text(), "pid="); ok {
				if pid, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					j.pids <- pid
				}
			}
		}
		j.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	return j
}

// waitPids waits for n announced pids.
func (j *job) waitPids(t *testing.T, n int) []int {
	t.Helper()
	var pids []int
	timeout := time.After(30 * time.Second)
	for len(pids) < n {
		select {
		case pid := <-j.pids:
			pids = append(pids, pid)
		case <-timeout:
			t.Fatalf("got pids %v, want %d within 30s", pids, n)
		}
	}
	return pids
}

// wait returns gtrain's exit code.
func (j *job) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-j.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(60 * time.Second):
		t.Fatal("gtrain did not exit within 60s")
		return -1
	}
}

// awaitGone polls until every pid has ended; processes are torn down
// asynchronously after gtrain itself is killed.
func awaitGone(t *testing.T, pids []int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var alive []int
		for _, pid := range pids {
			if proctest.Alive(pid) {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the job still running after %v: %v", within, alive)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sleeper is a rank that starts a grandchild and announces both pids.
const sleeper = `sleep 300 & echo "pid=$!"; echo "pid=$$"; wait`

// TestSignalTeardown: SIGINT, SIGTERM and SIGKILL to gtrain each leave no
// process of the job running: not the ranks, not their children.
func TestSignalTeardown(t *testing.T) {
	tests := []struct {
		sig      syscall.Signal
		wantCode int
	}{
		{syscall.SIGINT, 130},
		{syscall.SIGTERM, 143},
		{syscall.SIGKILL, 137},
	}
	for _, tt := range tests {
		t.Run(tt.sig.String(), func(t *testing.T) {
			j := startJob(t, "run", "--nproc-per-node", "3", "--grace-period", "5s", "--", "sh", "-c", sleeper)
			pids := j.waitPids(t, 6)
			if err := j.cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			if code := j.wait(t); code != tt.wantCode {
				t.Errorf("gtrain exit code = %d, want %d", code, tt.wantCode)
			}
			awaitGone(t, pids, 20*time.Second)
		})
	}
}

// TestConcurrentJobsIsolated: a job failing and tearing down leaves another
// job on the same machine untouched.
func TestConcurrentJobsIsolated(t *testing.T) {
	a := startJob(t, "run", "--nproc-per-node", "2", "--grace-period", "5s", "--", "sh", "-c", sleeper)
	pidsA := a.waitPids(t, 4)
	// Rank 1 of job B fails once rank 0 has started its child.
	ready := filepath.Join(t.TempDir(), "ready")
	b := startJob(t, "run", "--nproc-per-node", "2", "--grace-period", "5s", "--env", "READY="+ready, "--", "sh", "-c",
		`if [ "$RANK" = 1 ]; then while [ ! -e "$READY" ]; do sleep 0.05; done; exit 9; fi
sleep 300 & echo "pid=$!"; echo "pid=$$"; touch "$READY"; wait`)
	pidsB := b.waitPids(t, 2)
	if code := b.wait(t); code != 9 {
		t.Errorf("job B exit code = %d, want 9", code)
	}
	awaitGone(t, pidsB, 20*time.Second)
	for _, pid := range pidsA {
		if !proctest.Alive(pid) {
			t.Errorf("job A's pid %d died when job B was torn down", pid)
		}
	}
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t); code != 143 {
		t.Errorf("job A exit code = %d, want 143", code)
	}
	awaitGone(t, pidsA, 20*time.Second)
}

package train

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// asyncKillEnv makes the test binary, re-executed by
// TestAsyncKillDuringWrite, the job it kills: its value is the
// checkpoint directory.
const asyncKillEnv = "GTRAIN_ASYNC_KILL_CHILD"

// asyncKillSpec is the killed job: two ranks, an asynchronous checkpoint
// every 2 steps, the newest 3 kept.
func asyncKillSpec(dir string) Spec {
	s := dpSpec(1, 2)
	s.Steps = 40
	s.Checkpoint = CkptSpec{Dir: dir, Every: 2, Keep: 3, Async: true}
	return s
}

// lockedWriter serialises the lines the child's goroutines print.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// asyncKillChild is the child: it runs the job's two ranks in this
// process as a restart (from the newest valid checkpoint, if any) and
// prints rank 0's status records, "writing N" when a rank's goroutine
// starts writing step N, and "committed N" once the trainer has
// completed the checkpoint of step N.
func asyncKillChild(dir string) {
	out := &lockedWriter{w: os.Stdout}
	testHookAsyncWrite = func(rank, step int) {
		if rank == 0 {
			fmt.Fprintf(out, "writing %d\n", step)
		}
	}
	saved := ""
	testHookStep = func(tr *Trainer) {
		if tr.env.Rank == 0 && tr.saved != saved {
			saved = tr.saved
			step, _ := ckpt.ParseStepDir(filepath.Base(saved))
			fmt.Fprintf(out, "committed %d\n", step)
		}
	}
	ctx := context.Background()
	trs := comm.NewInProc(2)
	errs := commtest.Run(2, nil, func(r int) error {
		c, err := comm.New(ctx, r, 2, trs[r], comm.Options{Name: "dp", Timeout: time.Minute})
		if err != nil {
			return err
		}
		defer c.Close()
		env := Env{Rank: r, World: 2, LocalWorld: 2, Comm: c, Restart: true}
		if r == 0 {
			env.Status = out
		}
		_, err = Run(ctx, asyncKillSpec(dir), env)
		return err
	})
	for _, err := range errs {
		if err != nil {
			fmt.Fprintln(os.Stderr, "killed job:", err)
			os.Exit(3)
		}
	}
	fmt.Fprintln(out, "done")
}

// TestAsyncKillDuringWrite SIGKILLs a job with asynchronous checkpoints
// soon after one of its writes starts (mostly within a few milliseconds,
// while the write or its commit is in flight; sometimes later), and
// restarts it each time from its newest valid checkpoint. After every
// kill the newest valid checkpoint is at least the last one the job
// completed; at least one kill must have caught a write that had not
// committed; and the losses of every step, over all the attempts, are
// exactly those of an uninterrupted run.
func TestAsyncKillDuringWrite(t *testing.T) {
	if dir := os.Getenv(asyncKillEnv); dir != "" {
		asyncKillChild(dir)
		os.Exit(0)
	}
	want := runRanks(t, asyncKillSpec(""), 2, nil)[0].Losses
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 2))
	dir := t.TempDir()
	got := map[int]float32{}
	acked, caught := 0, 0
	for kill := 0; ; kill++ {
		var delay time.Duration
		if kill < 10 {
			delay = time.Duration(rnd.IntN(5000)) * time.Microsecond
			if kill%3 == 2 {
				delay *= 10
			}
		}
		a := runKilled(t, dir, acked+2, delay, got)
		acked = max(acked, a.committed)
		if !a.killed {
			break
		}
		c, ok := NewestValid(t.Context(), dir)
		newest := 0
		if ok {
			newest = int(c.Step())
		}
		if newest < acked {
			t.Fatalf("kill %d: newest valid checkpoint %d, but the job had completed step %d's", kill, newest, acked)
		}
		if newest < a.writing {
			caught++
		}
		t.Logf("kill %d after %v: writing step %d, completed %d, newest valid %d", kill, delay, a.writing, acked, newest)
	}
	if caught == 0 {
		t.Errorf("no kill caught a write before its commit: the test did not test what it is for")
	}
	for s := 1; s <= len(want); s++ {
		if l, ok := got[s]; !ok || l != want[s-1] {
			t.Errorf("step %d: loss %v (reported %v) after kills and restarts, %v uninterrupted", s, l, ok, want[s-1])
		}
	}
	// metrics.jsonl went through every kill too: each step once, in order,
	// with the uninterrupted losses.
	checkMetricsFile(t, dir, want)
}

// killedRun is what one attempt of the killed job printed.
type killedRun struct {
	killed    bool
	writing   int // the last step whose write started
	committed int // the last step the job completed
}

// runKilled runs the child until it has started writing a step at or
// after from, kills it delay later (delay 0: lets it finish), and records
// its losses in losses, failing if a step's loss differs from an earlier
// attempt's.
func runKilled(t *testing.T, dir string, from int, delay time.Duration, losses map[int]float32) killedRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAsyncKillDuringWrite$")
	cmd.Env = append(os.Environ(), asyncKillEnv+"="+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	backstopTimer := time.AfterFunc(backstop, func() { cmd.Process.Kill() })
	defer backstopTimer.Stop()
	var r killedRun
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		var rec Record
		switch {
		case strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &rec) == nil:
			if l, ok := losses[rec.Step]; ok && l != rec.Loss {
				t.Errorf("step %d: loss %v, an earlier attempt %v", rec.Step, rec.Loss, l)
			}
			losses[rec.Step] = rec.Loss
		case strings.HasPrefix(line, "writing "):
			r.writing, _ = strconv.Atoi(strings.TrimPrefix(line, "writing "))
			if delay > 0 && !r.killed && r.writing >= from {
				r.killed = true
				time.AfterFunc(delay, func() { cmd.Process.Signal(syscall.SIGKILL) })
			}
		case strings.HasPrefix(line, "committed "):
			r.committed, _ = strconv.Atoi(strings.TrimPrefix(line, "committed "))
		}
	}
	err = cmd.Wait()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case r.killed && !(ws.Signaled() && ws.Signal() == syscall.SIGKILL):
		t.Fatalf("the job ended by itself (%v) before the kill:\n%s", err, stderr.String())
	case !r.killed && err != nil:
		t.Fatalf("the last attempt: %v\n%s", err, stderr.String())
	}
	return r
}

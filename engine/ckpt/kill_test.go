package ckpt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killChildEnv makes the test binary, re-executed by TestKillDuringWrite,
// the writer it kills: its value is the checkpoint root.
const killChildEnv = "GTRAIN_CKPT_KILL_CHILD"

// killScale sizes the tensors of the killed writer: about 3 MB per
// checkpoint, in two rank files.
const killScale = 2500

// killWriter is the child: from the latest checkpoint on, it writes and
// commits one checkpoint after another (two ranks writing concurrently,
// keeping 2), printing "committed STEP" after each, until it is killed.
func killWriter(root string) {
	var step int64
	if c, err := Latest(context.Background(), root, nil); err == nil {
		step = c.Step()
	}
	fmt.Println("started")
	for {
		step++
		if err := writeCheckpoint(root, step, 2, killScale, 2, nil); err != nil {
			fmt.Fprintln(os.Stderr, "killed writer:", err)
			os.Exit(3)
		}
		fmt.Println("committed", step)
	}
}

// TestKillDuringWrite SIGKILLs a checkpoint writer at random moments; after
// each kill the newest valid checkpoint must be at least the last one whose
// commit returned, hold exactly its step's content, and the run must be able
// to write and commit the next checkpoint.
func TestKillDuringWrite(t *testing.T) {
	if root := os.Getenv(killChildEnv); root != "" {
		killWriter(root)
		return
	}
	iters := 24
	if testing.Short() {
		iters = 6
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 0))
	root := t.TempDir()
	acked, interrupted := int64(0), 0
	for i := range iters {
		step, err := killOnce(t, root, time.Duration(rnd.IntN(400))*time.Millisecond)
		if err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
		acked = max(acked, step)
		if leftovers(t, root) {
			interrupted++
		}
		var w warnings
		c, err := Latest(t.Context(), root, w.warn)
		switch {
		case acked == 0 && errors.Is(err, ErrNoCheckpoint):
			continue // killed before its first commit returned
		case err != nil:
			t.Fatalf("kill %d: Latest: %v (warnings: %s)", i, err, &w)
		case c.Step() < acked:
			t.Fatalf("kill %d: Latest is step %d, but the commit of step %d had returned", i, c.Step(), acked)
		}
		if err := checkContent(c, killScale); err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
		// Resume: the next step may be the directory the writer was killed in.
		next := c.Step() + 1
		if err := writeCheckpoint(root, next, 2, killScale, 2, nil); err != nil {
			t.Fatalf("kill %d: write step %d after the kill: %v", i, next, err)
		}
		if c, err := Latest(t.Context(), root, nil); err != nil || c.Step() != next {
			t.Fatalf("kill %d: after writing step %d, Latest = %v, %v", i, next, c, err)
		}
		if steps := stepsIn(t, root); len(steps) > 2 {
			t.Fatalf("kill %d: step directories %v after a commit keeping 2", i, steps)
		}
		acked = next
	}
	t.Logf("%d kills, %d of them left an interrupted write behind; last step %d", iters, interrupted, acked)
	if interrupted == 0 {
		t.Errorf("no kill interrupted a write: the test did not test what it is for")
	}
}

// killOnce starts the writer, SIGKILLs it delay after it started writing,
// and returns the last step it said it committed.
func killOnce(t *testing.T, root string, delay time.Duration) (int64, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillDuringWrite$")
	cmd.Env = append(os.Environ(), killChildEnv+"="+root)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "started" {
		cmd.Process.Kill()
		cmd.Wait()
		return 0, fmt.Errorf("writer did not start: %q\n%s", lines.Text(), stderr.String())
	}
	time.AfterFunc(delay, func() { cmd.Process.Kill() })
	var acked int64
	for lines.Scan() {
		if s, ok := strings.CutPrefix(lines.Text(), "committed "); ok {
			acked, _ = strconv.ParseInt(s, 10, 64)
		}
	}
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return 0, fmt.Errorf("writer ended by itself (%v), not by SIGKILL:\n%s", err, stderr.String())
	}
	return acked, nil
}

// leftovers reports whether root holds what an interrupted write leaves (a
// temporary file, or a step directory without a manifest), and fails the
// test if any temporary file is listed by a manifest.
func leftovers(t *testing.T, root string) bool {
	found := false
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if isTemp(d.Name()) {
			found = true
		}
		if _, ok := ParseStepDir(d.Name()); ok && d.IsDir() {
			m, err := readManifest(path)
			if err != nil {
				found = true
				return nil
			}
			for _, f := range m.Files {
				if isTemp(f.Name) {
					t.Errorf("%s lists the temporary file %s", path, f.Name)
				}
			}
		}
		return nil
	})
	return found
}

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/proctest"
	"github.com/gtrain/gtrain/internal/slurmtest"
)

// The Slurm tier: a real Slurm (slurmctld, a slurmd on each of two
// network-namespace hosts, munge; internal/slurmtest), jobs submitted
// with sbatch whose batch script runs gtrain, which finds the allocation
// in its environment and starts its agents with srun.

// sbatchJob is a submitted batch job; sbatch --wait runs until it ends.
type sbatchJob struct {
	id   string
	out  string // the batch script's output file
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// submit writes script as a batch script and submits it on nodes nodes
// with extra sbatch options.
func submit(t *testing.T, c *slurmtest.Cluster, dir, name, script string, extra ...string) *sbatchJob {
	t.Helper()
	path := filepath.Join(dir, name+".sh")
	if !strings.HasPrefix(script, "#!") {
		script = "#!/bin/sh\n" + script
	}
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	j := &sbatchJob{out: filepath.Join(dir, name+".out"), done: make(chan struct{})}
	args := append([]string{"--parsable", "--wait", "--nodes=2", "--chdir=" + dir, "--output=" + j.out, "--job-name=" + name}, extra...)
	j.cmd = c.Command(context.Background(), "sbatch", append(args, path)...)
	stdout, err := j.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	j.cmd.Stderr = &stderr
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	j.id = strings.TrimSpace(strings.Split(line, ";")[0])
	if err != nil || j.id == "" {
		_ = j.cmd.Wait()
		t.Fatalf("sbatch: no job id (%v): %s", err, stderr.String())
	}
	go func() { j.err = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() {
		// A failed test leaves no job behind to hold the nodes.
		_ = c.Command(context.Background(), "scancel", j.id).Run()
		<-j.done
	})
	return j
}

// wait waits for the job to end and returns its exit code (sbatch
// --wait's), failing t after limit.
func (j *sbatchJob) wait(t *testing.T, c *slurmtest.Cluster, limit time.Duration) int {
	t.Helper()
	select {
	case <-j.done:
	case <-time.After(limit): // backstop
		t.Fatalf("job %s did not end within %v\n%s\n%s", j.id, limit, j.output(), c.Logs())
	}
	var ee *exec.ExitError
	switch {
	case j.err == nil:
		return 0
	case errors.As(j.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("sbatch: %v", j.err)
	return -1
}

func (j *sbatchJob) output() string {
	b, _ := os.ReadFile(j.out)
	return string(b)
}

// waitFor waits until the job's output matches re, or fails t after limit
// or when the job ends first.
func (j *sbatchJob) waitFor(t *testing.T, re *regexp.Regexp, limit time.Duration) string {
	t.Helper()
	deadline := time.After(limit) // backstop
	for {
		if m := re.FindString(j.output()); m != "" {
			return m
		}
		select {
		case <-j.done:
			t.Fatalf("job %s ended before printing %q:\n%s", j.id, re, j.output())
		case <-deadline:
			t.Fatalf("job %s did not print %q within %v:\n%s", j.id, re, limit, j.output())
		case <-time.After(20 * time.Millisecond): // polling the output file
		}
	}
}

// waitFiles waits until every path exists (ranks announce themselves
// through files), or fails t after limit.
func waitFiles(t *testing.T, j *sbatchJob, limit time.Duration, paths ...string) {
	t.Helper()
	deadline := time.After(limit) // backstop
	for {
		missing := slices.DeleteFunc(slices.Clone(paths), func(p string) bool { _, err := os.Stat(p); return err == nil })
		if len(missing) == 0 {
			return
		}
		select {
		case <-j.done:
			t.Fatalf("job %s ended before writing %v:\n%s", j.id, missing, j.output())
		case <-deadline:
			t.Fatalf("job %s did not write %v within %v:\n%s", j.id, missing, limit, j.output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writeEngineJob writes a job of the built-in engine's test model: steps
// steps, a checkpoint in ckpt only when stopped.
func writeEngineJob(t *testing.T, dir, name, ckpt string, steps int) string {
	t.Helper()
	path := filepath.Join(dir, name)
	job := fmt.Sprintf(`model: {preset: test}
data: {synthetic: 20000}
batch: {micro_batch: 2, seq: 32}
steps: %d
optim: {warmup_steps: 2}
checkpoint: {dir: %s, every: 0}
eval: {every: 0}
log_every: 1
`, steps, ckpt)
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSlurm runs gtrain in sbatch jobs of two nodes on a real Slurm.
func TestSlurm(t *testing.T) {
	c := slurmtest.New(t, 2)
	bin := gtrainBin(t)
	// The test's temporary directory is on the file system every node
	// shares, as a cluster's home directories are.
	dir := t.TempDir()
	run := fmt.Sprintf("exec %s run --table never --heartbeat 1s --grace-period 20s", bin)

	t.Run("command", func(t *testing.T) {
		script := run + ` -- sh -c 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $(hostname) $MASTER_ADDR" > rank.$RANK'` + "\n"
		j := submit(t, c, dir, "command", script, "--ntasks-per-node=2")
		if code := j.wait(t, c, 3*time.Minute); code != 0 {
			t.Fatalf("job exit %d:\n%s", code, j.output())
		}
		for rank := range 4 {
			b, err := os.ReadFile(filepath.Join(dir, "rank."+strconv.Itoa(rank)))
			if err != nil {
				t.Fatalf("rank %d did not run: %v\n%s", rank, err, j.output())
			}
			f := strings.Fields(string(b))
			want := []string{strconv.Itoa(rank), strconv.Itoa(rank % 2), "4", c.Hosts[rank/2].Name, c.Hosts[0].IP}
			if !slices.Equal(f, want) {
				t.Errorf("rank %d: rank, local rank, world, host, master = %q, want %q", rank, f, want)
			}
		}
	})

	t.Run("auto", func(t *testing.T) {
		// Inside the allocation, with no hostfile, --auto lays the job out
		// from what the nodes' agents report, not from the batch script's
		// node (it used to plan from the launcher's own memory).
		job := writeEngineJob(t, dir, "auto.yaml", filepath.Join(dir, "auto-ckpt"), 2)
		j := submit(t, c, dir, "auto", run+" --auto --job "+job+"\n", "--ntasks-per-node=1")
		if code := j.wait(t, c, 3*time.Minute); code != 0 {
			t.Fatalf("job exit %d:\n%s", code, j.output())
		}
		if out := j.output(); !strings.Contains(out, "from the hosts' reported facts: --auto: tp=") || regexp.MustCompile(`(?m)^gtrain: --auto: tp=`).MatchString(out) {
			t.Errorf("want the layout planned from the nodes' reported facts only:\n%s", out)
		}
	})

	t.Run("pytorch ddp", func(t *testing.T) {
		python := proctest.NeedTorch(t)
		script, err := filepath.Abs("../../examples/ddp_allreduce.py")
		if err != nil {
			t.Fatal(err)
		}
		// gloo binds the address of the interface it is told, as on real clusters.
		j := submit(t, c, dir, "ddp", run+" --env GLOO_SOCKET_IFNAME=eth0 -- "+python+" "+script+"\n", "--ntasks-per-node=2")
		if code := j.wait(t, c, 4*time.Minute); code != 0 {
			t.Fatalf("job exit %d:\n%s", code, j.output())
		}
		for rank := range 4 {
			if want := "rank " + strconv.Itoa(rank) + "/4: ok"; !strings.Contains(j.output(), want) {
				t.Errorf("no %q in the job's output:\n%s", want, j.output())
			}
		}
	})

	t.Run("scancel", func(t *testing.T) {
		// Renamed into place: the test reads a file only once it is whole.
		script := run + ` -- sh -c 'echo $$ > pid.$RANK.tmp && mv pid.$RANK.tmp pid.$RANK && exec sleep 600'` + "\n"
		j := submit(t, c, dir, "scancel", script, "--ntasks-per-node=1")
		pids := []string{filepath.Join(dir, "pid.0"), filepath.Join(dir, "pid.1")}
		waitFiles(t, j, 2*time.Minute, pids...)
		if out, err := c.Command(t.Context(), "scancel", j.id).CombinedOutput(); err != nil {
			t.Fatalf("scancel: %v: %s", err, out)
		}
		j.wait(t, c, 2*time.Minute)
		for _, p := range pids {
			b, _ := os.ReadFile(p)
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("%s: %q", p, b)
			}
			// Slurm kills the steps' processes after scancel returns: poll.
			deadline := time.Now().Add(time.Minute)
			for proctest.Alive(pid) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if proctest.Alive(pid) {
				t.Errorf("rank process %d survived scancel", pid)
			}
		}
		// sbatch --wait may return while Slurm still shows the job
		// COMPLETING: poll for its final state.
		state, _, err := c.JobState(t.Context(), j.id)
		for deadline := time.Now().Add(time.Minute); err == nil && state == "COMPLETING" && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			state, _, err = c.JobState(t.Context(), j.id)
		}
		if err != nil || state != "CANCELLED" {
			t.Errorf("job state %q (%v), want CANCELLED", state, err)
		}
	})

	t.Run("preempt and resume", func(t *testing.T) {
		ckpt := filepath.Join(dir, "ckpt")
		job := writeEngineJob(t, dir, "job.yaml", ckpt, 50000)
		j := submit(t, c, dir, "train", run+" --job "+job+"\n", "--ntasks-per-node=1")
		j.waitFor(t, regexp.MustCompile(`(?m)^\[h0:0\] step +1/`), 3*time.Minute)
		// To the job's steps (the agents and their ranks), as Slurm's
		// --signal=USR1@90 sends it; not to the batch script's gtrain.
		if out, err := c.Command(t.Context(), "scancel", "--signal=USR1", j.id).CombinedOutput(); err != nil {
			t.Fatalf("scancel --signal=USR1: %v: %s", err, out)
		}
		if code := j.wait(t, c, 3*time.Minute); code != 75 {
			state, exit, err := c.JobState(t.Context(), j.id)
			t.Fatalf("job exit %d (%s %s %v), want 75 (resumable):\n%s", code, state, exit, err, j.output())
		}
		m := regexp.MustCompile(`preempted at step ([0-9]+): saved`).FindStringSubmatch(j.output())
		if m == nil {
			t.Fatalf("no 'preempted at step' line:\n%s", j.output())
		}
		n, _ := strconv.Atoi(m[1])
		step := filepath.Join(ckpt, fmt.Sprintf("step-%08d", n))
		if _, err := os.Stat(filepath.Join(step, "manifest.json")); err != nil {
			t.Fatalf("no checkpoint %s: %v\n%s", step, err, j.output())
		}
		resume := fmt.Sprintf("exec %s resume --table never --heartbeat 1s --set steps=%d %s\n", bin, n+2, ckpt)
		r := submit(t, c, dir, "resume", resume, "--ntasks-per-node=1")
		if code := r.wait(t, c, 3*time.Minute); code != 0 {
			t.Fatalf("resume job exit %d:\n%s", code, r.output())
		}
		out := r.output()
		if !strings.Contains(out, fmt.Sprintf("at step %d", n)) || !strings.Contains(out, fmt.Sprintf("step %d/%d ", n+2, n+2)) {
			t.Fatalf("the second job did not resume from step %d and finish:\n%s", n, out)
		}
	})

	// examples/slurm/train.sbatch as a user submits it: SIGUSR1 to the
	// job's steps (what --signal=USR1@90 sends before the time limit)
	// stops it resumable, the script requeues the job, and its second run
	// resumes from the checkpoint and finishes.
	t.Run("example requeue", func(t *testing.T) {
		script, err := os.ReadFile(filepath.Join("..", "..", "examples", "slurm", "train.sbatch"))
		if err != nil {
			t.Fatal(err)
		}
		ckpt := filepath.Join(dir, "example-ckpt")
		// Long enough that the signal comes before the end (steps take
		// milliseconds), short enough for the resumed run to finish.
		job := writeEngineJob(t, dir, "example.yaml", ckpt, 6000)
		j := submit(t, c, dir, "example", string(script), "--export=ALL,GTRAIN="+bin+",GTRAIN_JOB="+job+",GTRAIN_CKPT="+ckpt)
		j.waitFor(t, regexp.MustCompile(`(?m)^\[h0:0\] step +1/`), 3*time.Minute)
		if out, err := c.Command(t.Context(), "scancel", "--signal=USR1", j.id).CombinedOutput(); err != nil {
			t.Fatalf("scancel --signal=USR1: %v: %s", err, out)
		}
		if code := j.wait(t, c, 5*time.Minute); code != 0 {
			state, exit, _ := c.JobState(t.Context(), j.id)
			t.Fatalf("job exit %d (%s %s), want 0 after the requeued run:\n%s", code, state, exit, j.output())
		}
		out := j.output()
		for _, want := range []string{`preempted at step`, `restart 1 of job ` + j.id, `resumed from`, `step +6000/6000 `} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("the job's output lacks %q:\n%s", want, out)
			}
		}
	})
}

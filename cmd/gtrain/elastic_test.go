package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/internal/proctest"
	"github.com/gtrain/gtrain/launch/proto"
)

// Elastic membership over the real-sshd hosts (internal/netns): a host cut
// off mid-job is dropped, the job goes on with the hosts left (and a
// spare), and the built-in engine resumes from its newest checkpoint on
// the new world with the global batch it had.

// elasticJob is the built-in engine's job of these tests: a global batch
// of 6 sequences (micro_batch 2 on 3 ranks), a checkpoint every 2 steps,
// and enough steps that the job cannot end before a host is cut after
// its first checkpoint (the others then block in a collective).
const elasticJob = `model: {preset: test}
data: {synthetic: 20000}
batch: {micro_batch: %d, seq: 32}
steps: 24
optim: {warmup_steps: 2}
checkpoint: {dir: %s, every: 2, keep: 20}
eval: {every: 0}
log_every: 1
threads: 1
`

// writeJob writes the job with micro_batch micro and checkpoints in ckpt.
func writeJob(t *testing.T, micro int, ckpt string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(elasticJob, micro, ckpt)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// elasticRun is a `gtrain run --output json` in progress.
type elasticRun struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	done           chan error
}

// startElastic starts gtrain with args, its events as JSON on stdout.
func startElastic(t *testing.T, args ...string) *elasticRun {
	t.Helper()
	r := &elasticRun{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, done: make(chan error, 1)}
	r.cmd = exec.Command(gtrainBin(t), args...)
	r.cmd.Env = append(os.Environ(), "NO_COLOR=1")
	r.cmd.Stdout, r.cmd.Stderr = r.stdout, r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() { _ = r.cmd.Process.Kill() })
	return r
}

// awaitFile waits until path exists, failing the test if the job ends
// first or it does not appear within limit.
func (r *elasticRun) awaitFile(t *testing.T, path string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case err := <-r.done:
			t.Fatalf("job ended (%v) before %s appeared\n%s", err, path, r.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %v\n%s", path, limit, r.stderr.String())
		}
	}
}

// wait waits for the job's exit code.
func (r *elasticRun) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case err := <-r.done:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(limit):
		t.Fatalf("job did not end within %v\n%s", limit, r.stderr.String())
	}
	return -1
}

// events are the job's JSON events.
func (r *elasticRun) events(t *testing.T) []proto.Event {
	t.Helper()
	return decodeEvents(t, r.stdout.String())
}

func decodeEvents(t *testing.T, out string) []proto.Event {
	t.Helper()
	var evs []proto.Event
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, proto.MaxLine)
	for sc.Scan() {
		var ev proto.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// stepLosses is rank 0's loss at every step, the last report of each
// (a restart trains the steps since its checkpoint again).
func stepLosses(t *testing.T, evs []proto.Event) map[int]float32 {
	t.Helper()
	out := map[int]float32{}
	for _, ev := range evs {
		if ev.Type != proto.EventStatus || ev.Rank != 0 {
			continue
		}
		var rec struct {
			Step int     `json:"step"`
			Loss float32 `json:"loss"`
		}
		if err := json.Unmarshal(ev.Status, &rec); err != nil {
			t.Fatalf("status %s: %v", ev.Status, err)
		}
		out[rec.Step] = rec.Loss
	}
	return out
}

// hostEvent is the first event of type typ about host, nil if none.
func hostEvent(evs []proto.Event, typ, host string) *proto.Event {
	for i, ev := range evs {
		if ev.Type == typ && ev.Host == host {
			return &evs[i]
		}
	}
	return nil
}

// resumedAt is the step the restart resumed from, read from rank 0's log.
var resumedAt = regexp.MustCompile(`restart: resumed from \S+ at step (\d+)`)

// elasticArgs are the flags of an elastic engine job on c's hosts.
func elasticArgs(c *netns.Cluster, nnodes, job string) []string {
	args := append([]string{"run", "--hostfile", c.Hostfile(1), "--output", "json", "--table", "never"}, sshArgs(c)...)
	return append(args, "--nnodes", nnodes, "--max-restarts", "2", "--job", job)
}

// TestElasticEngineGoesOnWithoutHost: 3 hosts, --nnodes 2:3; host 2 cut off
// after the first checkpoint: the job is restarted on hosts 0 and 1 from
// its newest checkpoint, resharded from 3 ranks to 2 with the global batch
// of 6 sequences, and finishes; every step's loss (the steps trained again
// after the restart included) equals an uninterrupted run of one rank on
// the same global batch, to the engine's data-parallel tolerance.
func TestElasticEngineGoesOnWithoutHost(t *testing.T) {
	c := netns.New(t, 3)
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	r := startElastic(t, elasticArgs(c, "2:3", writeJob(t, 2, ckpt))...)
	r.awaitFile(t, filepath.Join(ckpt, "step-00000002", "manifest.json"), 120*time.Second)
	c.Cut(2)
	if code := r.wait(t, 180*time.Second); code != 0 {
		t.Fatalf("gtrain exit %d\n%s", code, r.stderr.String())
	}
	evs := r.events(t)
	if ev := hostEvent(evs, proto.EventHostDropped, c.Hosts[2].IP); ev == nil || !strings.Contains(ev.Message, "agent lost") {
		t.Errorf("host_dropped for %s: %+v, want one saying its agent was lost", c.Hosts[2].IP, ev)
	}
	log := logLines(evs)
	m := resumedAt.FindStringSubmatch(log)
	if m == nil || !strings.Contains(log, "resharded: checkpoint of 3 ranks") {
		t.Fatalf("rank 0 did not say it resumed, resharded from 3 ranks:\n%s\n%s", log, r.stderr.String())
	}
	if notes := notices(evs); !strings.Contains(notes, "attempt 1 runs on 2 ranks: tp 1 × pp 1 × dp 2") {
		t.Errorf("the notices do not say attempt 1 runs on 2 ranks:\n%s", notes)
	}
	ref := referenceLosses(t)
	compareLosses(t, stepLosses(t, evs), ref, 24)
}

// referenceLosses trains the same job on one rank of this machine, with
// micro_batch 6: the same global batch, uninterrupted.
func referenceLosses(t *testing.T) map[int]float32 {
	t.Helper()
	job := writeJob(t, 6, filepath.Join(t.TempDir(), "ckpt"))
	code, out, stderr := runGtrain(t, 120*time.Second, "run", "--output", "json", "--table", "never", "--job", job)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	return stepLosses(t, decodeEvents(t, out))
}

// compareLosses checks steps 1..n of got against want: data parallelism
// and resharding keep a loss within float32 summation order of the single
// rank's (engine/train's fp32Tol; measured 1.1e-7 over the 24 steps).
func compareLosses(t *testing.T, got, want map[int]float32, n int) {
	t.Helper()
	const tol = 1e-6
	worst := 0.0
	for s := 1; s <= n; s++ {
		g, okG := got[s]
		w, okW := want[s]
		if !okG || !okW || w == 0 {
			t.Fatalf("step %d: loss %v (%v), reference %v (%v)", s, g, okG, w, okW)
		}
		worst = max(worst, math.Abs(float64(g)-float64(w))/math.Abs(float64(w)))
	}
	t.Logf("largest relative loss difference over %d steps: %.2g", n, worst)
	if worst > tol {
		t.Errorf("losses %v, uninterrupted reference %v: relative difference %.2g > %g", got, want, worst, tol)
	}
}

// notices is the launcher's notices, one a line.
func notices(evs []proto.Event) string {
	var sb strings.Builder
	for _, ev := range evs {
		if ev.Type == proto.EventNotice {
			sb.WriteString(ev.Message + "\n")
		}
	}
	return sb.String()
}

// logLines is every rank's output, one line each.
func logLines(evs []proto.Event) string {
	var sb strings.Builder
	for _, ev := range evs {
		if ev.Type == proto.EventLog {
			sb.WriteString(ev.Line + "\n")
		}
	}
	return sb.String()
}

// TestElasticEngineTakesSpare: 4 hosts, --nnodes 2:3 (host 3 a spare);
// host 1 cut off: the job goes on with hosts 0, 2 and the spare, 3 ranks
// as before, and finishes with the uninterrupted losses.
func TestElasticEngineTakesSpare(t *testing.T) {
	c := netns.New(t, 4)
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	r := startElastic(t, elasticArgs(c, "2:3", writeJob(t, 2, ckpt))...)
	r.awaitFile(t, filepath.Join(ckpt, "step-00000002", "manifest.json"), 120*time.Second)
	c.Cut(1)
	if code := r.wait(t, 180*time.Second); code != 0 {
		t.Fatalf("gtrain exit %d\n%s", code, r.stderr.String())
	}
	evs := r.events(t)
	if hostEvent(evs, proto.EventHostDropped, c.Hosts[1].IP) == nil || hostEvent(evs, proto.EventHostAdded, c.Hosts[3].IP) == nil {
		t.Fatalf("want host %s dropped and the spare %s added:\n%s", c.Hosts[1].IP, c.Hosts[3].IP, r.stderr.String())
	}
	ranksOn := map[string]bool{}
	started := 0
	for _, ev := range evs {
		if ev.Type == proto.EventRankStarted {
			started++
			if started > 3 { // the restart's ranks
				ranksOn[ev.Host] = true
			}
		}
	}
	if started != 6 || !ranksOn[c.Hosts[3].IP] || ranksOn[c.Hosts[1].IP] {
		t.Errorf("%d ranks started, the restart's on %v; want 3 then 3 with the spare, without %s", started, ranksOn, c.Hosts[1].IP)
	}
	compareLosses(t, stepLosses(t, evs), referenceLosses(t), 24)
}

// TestElasticMinNotMet: 2 hosts, --nnodes 2:2: with host 1 cut off (it
// does not answer the probe at the restart either) the job fails at once,
// naming the host lost and why, without waiting out its restarts.
func TestElasticMinNotMet(t *testing.T) {
	c := netns.New(t, 2)
	dir := t.TempDir()
	args := append([]string{"run", "--hostfile", c.Hostfile(1), "--table", "never", "--nnodes", "2", "--max-restarts", "3",
		"--ssh-timeout", "2s", "--env", "OUT=" + dir}, sshArgs(c)...)
	r := startElastic(t, append(args, "--", "sh", "-c", `echo ready > "$OUT/ready.$RANK"; exec sleep 300`)...)
	r.awaitFile(t, filepath.Join(dir, "ready.1"), 60*time.Second)
	c.Cut(1)
	if code := r.wait(t, 120*time.Second); code != ExitFailure {
		t.Fatalf("gtrain exit %d, want %d\n%s", code, ExitFailure, r.stderr.String())
	}
	want := fmt.Sprintf("elastic: 1 healthy host(s) left, fewer than the --nnodes minimum 2; lost: %s (unreachable after 1 failure(s): agent lost: no heartbeat", c.Hosts[1].IP)
	if stderr := r.stderr.String(); !strings.Contains(stderr, want) || strings.Contains(stderr, "restart 2 of 3") {
		t.Errorf("stderr does not say %q (once):\n%s", want, stderr)
	}
}

// TestElasticDDP: PyTorch DDP (examples/ddp_elastic.py) on 3 hosts,
// --nnodes 2:3; host 2 cut off while every rank holds after step 3: the
// script is restarted on 2 hosts with WORLD_SIZE 2 and restart count 1,
// resumes from its own checkpoint and finishes with the losses of an
// uninterrupted run.
func TestElasticDDP(t *testing.T) {
	python := proctest.NeedTorch(t)
	c := netns.New(t, 3)
	script, _ := filepath.Abs("../../examples/ddp_elastic.py")
	ckpt := t.TempDir()
	args := append([]string{"run", "--hostfile", c.Hostfile(1), "--table", "never", "--nnodes", "2:3", "--max-restarts", "2",
		"--env", "GLOO_SOCKET_IFNAME=eth0"}, sshArgs(c)...)
	r := startElastic(t, append(args, "--", python, script, "--ckpt", ckpt, "--hold-after", "3")...)
	for rank := range 3 {
		r.awaitFile(t, filepath.Join(ckpt, "HOLD."+strconv.Itoa(rank)), 180*time.Second)
	}
	c.Cut(2)
	if code := r.wait(t, 240*time.Second); code != 0 {
		t.Fatalf("gtrain exit %d\nstdout:\n%s\nstderr:\n%s", code, r.stdout.String(), r.stderr.String())
	}
	out := r.stdout.String()
	if !strings.Contains(out, "attempt 0 world 3 from step 0") || !strings.Contains(out, "attempt 1 world 2 from step 3") {
		t.Fatalf("want attempt 0 on 3 ranks and attempt 1 on 2 from step 3:\n%s\n%s", out, r.stderr.String())
	}
	ref := t.TempDir()
	code, refOut, stderr := runGtrain(t, 120*time.Second, "run", "--table", "never", "--nproc-per-node", "1", "--", python, script, "--ckpt", ref)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	lossLine := regexp.MustCompile(`step (\d+) loss (\S+)`)
	losses := func(out string) map[int]float32 {
		m := map[int]float32{}
		for _, s := range lossLine.FindAllStringSubmatch(out, -1) {
			step, _ := strconv.Atoi(s[1])
			v, err := strconv.ParseFloat(s[2], 32)
			if err != nil {
				t.Fatalf("loss %q: %v", s[2], err)
			}
			m[step] = float32(v) // the last report of a step: the restart's
		}
		return m
	}
	last := losses(out)
	compareLosses(t, last, losses(refOut), 8)
	if len(last) != 8 {
		t.Errorf("losses of %d steps, want 8:\n%s", len(last), out)
	}
}

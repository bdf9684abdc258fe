package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/internal/proctest"
)

// The built-in engine in per-node mode: `gtrain run --nnodes N
// --node-rank auto ...` with no command on every node trains the job that
// `gtrain run --hostfile` trains over the same hosts.

// perNodeEngineJob is the engine's job of these tests: 8 steps, a
// checkpoint every 2, and no checkpoint.dir, so that each run's goes in
// runs/ of its --chdir (runs/<rdzv-id> per node).
const perNodeEngineJob = `model: {preset: test}
data: {synthetic: 20000}
batch: {micro_batch: 2, seq: 32}
steps: %s
optim: {warmup_steps: 2}
checkpoint: {every: %s, keep: 3}
eval: {every: 0}
log_every: 1
threads: 1
`

// writePerNodeJob writes perNodeEngineJob with steps and checkpoint every.
func writePerNodeJob(t *testing.T, steps, every string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.yaml")
	job := strings.Replace(strings.Replace(perNodeEngineJob, "%s", steps, 1), "%s", every, 1)
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runLosses reads the losses of steps 1 to steps from the metrics file of
// the run directory dir: once each, in order.
func runLosses(t *testing.T, dir string, steps int) map[int]float32 {
	t.Helper()
	got := map[int]float32{}
	next := 1
	err := train.ReadMetrics(filepath.Join(dir, train.MetricsFile), func(m train.MetricsLine) error {
		if m.Step != next {
			t.Errorf("%s: record %d is step %d, want %d", dir, next, m.Step, next)
		}
		got[m.Step] = m.Loss
		next++
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	if len(got) != steps {
		t.Fatalf("%s: %d steps in %s, want %d", dir, len(got), train.MetricsFile, steps)
	}
	return got
}

// onlyRun is the one run directory in runs.
func onlyRun(t *testing.T, runs string) string {
	t.Helper()
	ents, err := os.ReadDir(runs)
	if err != nil || len(ents) != 1 {
		t.Fatalf("%s: %v (%d entries), want one run directory", runs, err, len(ents))
	}
	return filepath.Join(runs, ents[0].Name())
}

// loopbackNode starts node i of a per-node job of 2 nodes on this machine
// (127.0.0.1+i, one rank each); the first to bind endpoint hosts the
// rendezvous.
func loopbackNode(t *testing.T, endpoint, id string, i int, extra ...string) *node {
	args := []string{"run", "--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-id", id,
		"--local-addr", "127.0.0." + strconv.Itoa(i+1), "--nproc-per-node", "1", "--table", "never",
		"--heartbeat", "500ms", "--grace-period", "3s", "--join-timeout", "90s"}
	return startNode(t, nil, i, testSecret, append(args, extra...)...)
}

// TestPerNodeEngineMatchesHostfile: 2 network-namespace hosts, one rank
// each; the built-in engine started per node trains the job to its end
// in runs/<rdzv-id>, with every step's loss, in metrics.jsonl, equal (bit
// for bit) to the same job run with --hostfile over the same hosts.
func TestPerNodeEngineMatchesHostfile(t *testing.T) {
	c := netns.New(t, 2)
	job := writePerNodeJob(t, "8", "2")
	sshDir, perDir := t.TempDir(), t.TempDir()
	code, _, stderr := runGtrain(t, 3*time.Minute, runArgs(c, 1, []string{"--job", job, "--chdir", sshDir})...)
	if code != 0 {
		t.Fatalf("gtrain run --hostfile: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(sshDir, "runs")), 8)

	endpoint := c.Hosts[0].IP + ":29400"
	extra := []string{"--nproc-per-node", "1", "--job", job, "--chdir", perDir}
	nodes := []*node{
		startNode(t, c, 0, testSecret, perNodeArgs(c, endpoint, "engine-job", 0, 2, extra)...),
		startNode(t, c, 1, testSecret, perNodeArgs(c, endpoint, "engine-job", 1, 2, extra)...),
	}
	for i, n := range nodes {
		if code := n.wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s", i, code, n.err.String())
		}
	}
	got := runLosses(t, filepath.Join(perDir, "runs", "engine-job"), 8)
	for s := 1; s <= 8; s++ {
		if got[s] != want[s] {
			t.Errorf("step %d: loss %v per node, %v with --hostfile", s, got[s], want[s])
		}
	}
}

// TestPerNodeEngineOtherJob: a node given another job (another
// optim.lr) than the other is refused: both nodes exit 1 naming both
// nodes, and no rank starts (no run directory is made).
func TestPerNodeEngineOtherJob(t *testing.T) {
	endpoint, dir := freeLoopbackPort(t), t.TempDir()
	job := writePerNodeJob(t, "8", "2")
	nodes := []*node{
		loopbackNode(t, endpoint, "other-job", 0, "--job", job, "--chdir", dir),
		loopbackNode(t, endpoint, "other-job", 1, "--job", job, "--set", "optim.lr=0.003", "--chdir", dir),
	}
	for i, n := range nodes {
		code := n.wait(t, 2*time.Minute)
		s := n.err.String()
		if code != 1 || !strings.Contains(s, "runs another job than node") || !strings.Contains(s, "127.0.0.1") || !strings.Contains(s, "127.0.0.2") {
			t.Errorf("node %d: exit %d, want 1 and a refusal naming both nodes:\n%s", i, code, s)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "runs")); !os.IsNotExist(err) {
		t.Errorf("%s/runs exists (%v): a refused job started ranks", dir, err)
	}
}

// TestPerNodeEngineRankKilled: 2 network-namespace hosts, one rank
// each, --max-restarts 1; rank 0 (node 0's, the holder of the checkpoint
// directory's writer lock, which names its PID) is killed (SIGKILL) once
// a checkpoint is written. Both nodes restart the job, rank 0
// resumes from the newest checkpoint, and the job finishes with every
// step's loss (each once in metrics.jsonl, the steps trained again
// included) that of an uninterrupted run of the same job on 2 ranks of
// this machine.
func TestPerNodeEngineRankKilled(t *testing.T) {
	c := netns.New(t, 2)
	dir, refDir := t.TempDir(), t.TempDir()
	// 300 steps: the job is still running when the test kills rank 0,
	// however loaded the machine (its ranks slow down with the test).
	job := writePerNodeJob(t, "300", "2")
	code, _, stderr := runGtrain(t, 4*time.Minute, "run", "--nproc-per-node", "2", "--table", "never", "--job", job, "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), 300)

	endpoint := c.Hosts[0].IP + ":29400"
	extra := []string{"--nproc-per-node", "1", "--max-restarts", "1", "--job", job, "--chdir", dir}
	nodes := []*node{
		startNode(t, c, 0, testSecret, perNodeArgs(c, endpoint, "killed-job", 0, 2, extra)...),
		startNode(t, c, 1, testSecret, perNodeArgs(c, endpoint, "killed-job", 1, 2, extra)...),
	}
	run := filepath.Join(dir, "runs", "killed-job")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	waitFor(t, ctx, checkpointed(run))
	killWriter(t, run)
	for i, n := range nodes {
		if code := n.wait(t, 4*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s", i, code, n.err.String())
		}
		if !strings.Contains(n.err.String(), "restarting the job") {
			t.Errorf("node %d did not restart with the job:\n%s", i, n.err.String())
		}
	}
	if m := resumedAt.FindStringSubmatch(nodes[0].out.String()); m == nil {
		t.Errorf("rank 0 did not say it resumed from a checkpoint:\n%s", nodes[0].out.String())
	}
	compareLosses(t, runLosses(t, run, 300), want, 300)
}

// checkpointed says whether the run directory dir holds a committed
// checkpoint. Any step will do: the job keeps only its newest few, so a
// poll for one particular step can miss it on a fast run (and then waits
// out its backstop while the job finishes).
func checkpointed(dir string) func() bool {
	return func() bool {
		m, err := filepath.Glob(filepath.Join(dir, "step-*", "manifest.json"))
		return err == nil && len(m) > 0
	}
}

// killWriter kills (SIGKILL) the rank that holds the writer lock of the
// checkpoint directory dir: rank 0.
func killWriter(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ckpt.WriterLockName))
	if err != nil {
		t.Fatal(err)
	}
	var owner ckpt.LockOwner
	if err := json.Unmarshal(b, &owner); err != nil || owner.PID <= 1 {
		t.Fatalf("%s: %q: %v", ckpt.WriterLockName, b, err)
	}
	if err := syscall.Kill(owner.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill rank 0 (pid %d): %v", owner.PID, err)
	}
}

// TestPerNodeEngineElasticNewcomer: --nnodes 2:3, two nodes start the
// job (2 ranks, micro_batch 3: a global batch of 6 sequences); node 1's
// rank fails after step 5, and while the job restarts a third node,
// started only then, joins the new round. Attempt 1 runs on 3 ranks with
// the global batch of 6 on every node, the newcomer included (without the
// planner's state from the rounds it would lay its rank out for 9), and
// every step's loss is that of an uninterrupted run of one rank of
// micro_batch 6.
func TestPerNodeEngineElasticNewcomer(t *testing.T) {
	endpoint, dir, refDir := freeLoopbackPort(t), t.TempDir(), t.TempDir()
	job := writePerNodeJob(t, "12", "2")
	code, _, stderr := runGtrain(t, 3*time.Minute, "run", "--table", "never", "--job", job, "--set", "batch.micro_batch=6", "--chdir", refDir)
	if code != 0 {
		t.Fatalf("reference run: exit %d\n%s", code, stderr)
	}
	want := runLosses(t, onlyRun(t, filepath.Join(refDir, "runs")), 12)

	common := []string{"--nnodes", "2:3", "--max-restarts", "1", "--job", job, "--set", "batch.micro_batch=3", "--chdir", dir}
	nodes := []*node{
		loopbackNode(t, endpoint, "elastic-engine", 0, common...),
		loopbackNode(t, endpoint, "elastic-engine", 1, append(common, "--env", "GTRAIN_FAULT_FAIL_AFTER_STEP=5")...),
	}
	// The round of the restart waits 30 s (its last call) for more nodes
	// once 2 joined: the newcomer, started now, is in time.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	waitFor(t, ctx, func() bool { return strings.Contains(nodes[0].err.String(), "restarting the job") })
	nodes = append(nodes, loopbackNode(t, endpoint, "elastic-engine", 2, common...))
	for i, n := range nodes {
		if code := n.wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s", i, code, n.err.String())
		}
		if !strings.Contains(n.err.String(), "attempt 1 runs on 3 ranks: tp 1 × pp 1 × dp 3, micro_batch 2 × grad_accum 1, the global batch stays 6 sequences") {
			t.Errorf("node %d does not say attempt 1 runs on 3 ranks with the global batch of 6:\n%s", i, n.err.String())
		}
	}
	if m := resumedAt.FindStringSubmatch(nodes[0].out.String()); m == nil || m[1] != "4" {
		t.Errorf("rank 0 did not say it resumed at step 4 (%v):\n%s", m, nodes[0].out.String())
	}
	compareLosses(t, runLosses(t, filepath.Join(dir, "runs", "elastic-engine"), 12), want, 12)
}

// rankSeries finds the ranks a metrics page has gtrain_rank_step for.
var rankSeries = regexp.MustCompile(`(?m)^gtrain_rank_step\{[^}]*rank="(\d+)"`)

// jobInfo finds the job's info of the metrics tests on a metrics page.
var jobInfo = regexp.MustCompile(`(?m)^gtrain_job_info\{[^}]*run_id="metrics-job"`)

// TestPerNodeEngineMetrics: with --metrics-addr each node serves its own
// rank's metrics (node 0 rank 0, node 1 rank 1, never the other's) and
// the job's info, naming the layout the ranks run; Ctrl-C then stops
// both nodes.
func TestPerNodeEngineMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	cmds, urls := startMetricsNodes(t, ctx, "metrics-job", t.TempDir())
	pages := make([]string, 2)
	waitFor(t, ctx, func() bool {
		for i, u := range urls {
			pages[i] = scrape(t, ctx, "http://"+u+"/metrics")
		}
		return rankSeries.MatchString(pages[0]) && rankSeries.MatchString(pages[1])
	})
	for i, p := range pages {
		ranks := rankSeries.FindAllStringSubmatch(p, -1)
		if len(ranks) != 1 || ranks[0][1] != strconv.Itoa(i) {
			t.Errorf("node %d serves gtrain_rank_step of ranks %v, want only rank %d", i, ranks, i)
		}
		if !jobInfo.MatchString(p) {
			t.Errorf("node %d serves no gtrain_job_info of run metrics-job:\n%s", i, p)
		}
		// The layout the nodes planned, dp resolved from their world: it
		// read the job file's "dp 0".
		want := "dp 2, tp 1, pp 1, ZeRO stage 0, micro_batch 2, grad_accum 1, fp32"
		if got := infoLayouts(p); len(got) != 1 || got[0] != want {
			t.Errorf("node %d: gtrain_job_info layouts %q, want %q", i, got, want)
		}
	}
	interrupt(t, ctx, cmds)
}

// TestPerNodePrometheus: a real Prometheus per node (one scrape target
// per pod, as on Kubernetes), scraping every second, has a few samples of
// that node's rank; once the job is interrupted, rank 0's loss at the last
// scrape equals the loss metrics.jsonl has for the step of that scrape.
func TestPerNodePrometheus(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_PROMETHEUS", fmt.Errorf("no prometheus (apt-get install prometheus): %w", err))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute) // a backstop
	defer cancel()
	dir := t.TempDir()
	cmds, urls := startMetricsNodes(t, ctx, "prom-job", dir)
	proms := []*prometheus{startPrometheus(t, ctx, bin, urls[0]), startPrometheus(t, ctx, bin, urls[1])}
	waitFor(t, ctx, func() bool {
		return len(proms[0].samples(t, `gtrain_rank_step{rank="0"}[1m]`)) >= 3 && len(proms[1].samples(t, `gtrain_rank_step{rank="1"}[1m]`)) >= 3
	})
	interrupt(t, ctx, cmds)
	if other := proms[0].samples(t, `gtrain_rank_step{rank="1"}[5m]`); len(other) > 0 {
		t.Errorf("node 0's Prometheus has %d samples of rank 1, which node 1 runs", len(other))
	}
	loss := proms[0].samples(t, `gtrain_rank_loss{rank="0"}[5m]`)
	step := proms[0].samples(t, `gtrain_rank_step{rank="0"}[5m]`)
	lastLoss, lastStep := loss[len(loss)-1], step[len(step)-1]
	if lastLoss.at != lastStep.at {
		t.Fatalf("last loss sample at %v, last step sample at %v: want one scrape", lastLoss.at, lastStep.at)
	}
	n := int(lastStep.v)
	var want *train.MetricsLine
	train.ReadMetrics(filepath.Join(dir, "runs", "prom-job", train.MetricsFile), func(m train.MetricsLine) error {
		if m.Step == n {
			want = &m
		}
		return nil
	})
	if want == nil {
		t.Fatalf("metrics.jsonl has no step %d, the last one Prometheus scraped", n)
	} else if float32(lastLoss.v) != want.Loss {
		t.Errorf("step %d: Prometheus has rank 0's loss %v, metrics.jsonl %v", n, lastLoss.v, want.Loss)
	}
}

// startMetricsNodes starts the 2 nodes (one rank each, on this machine)
// of a long per-node job id of the built-in engine in dir, each serving
// --metrics-addr on a loopback port, and returns them and the addresses
// they announced.
func startMetricsNodes(t *testing.T, ctx context.Context, id, dir string) ([]*exec.Cmd, []string) {
	t.Helper()
	endpoint := freeLoopbackPort(t)
	job := writePerNodeJob(t, "1000000", "1000000")
	var cmds []*exec.Cmd
	var addrs []string
	for i := range 2 {
		cmd := exec.CommandContext(ctx, gtrainBin(t), "run", "--nnodes", "2", "--rdzv-endpoint", endpoint,
			"--rdzv-id", id, "--local-addr", "127.0.0."+strconv.Itoa(i+1), "--nproc-per-node", "1",
			"--table", "never", "--heartbeat", "500ms", "--grace-period", "3s", "--job", job, "--chdir", dir,
			"--metrics-addr", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "NO_COLOR=1", "GTRAIN_RDZV_SECRET="+testSecret)
		cmd.Stdout = io.Discard
		addrs = append(addrs, startScanningStderr(t, cmd))
		cmds = append(cmds, cmd)
	}
	return cmds, addrs
}

// interrupt sends SIGINT (Ctrl-C) to every node and waits for them all to
// exit; ctx is the backstop.
func interrupt(t *testing.T, ctx context.Context, cmds []*exec.Cmd) {
	t.Helper()
	done := make(chan error, len(cmds))
	for _, cmd := range cmds {
		cmd.Process.Signal(syscall.SIGINT)
		go func() { done <- cmd.Wait() }()
	}
	for range cmds {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("the nodes did not stop within the backstop after Ctrl-C")
		}
	}
}

// scrape is the metrics page at url ("" while it cannot be read).
func scrape(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return string(b)
}

// TestPerNodeEngineRefusals: what per-node mode does not do for the
// built-in engine is a usage error (exit 2) saying what to do, before any
// node waits for the others.
func TestPerNodeEngineRefusals(t *testing.T) {
	base := []string{"run", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "refused", "--table", "never"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"auto", []string{"--nnodes", "2", "--auto"}, "--auto is not available in per-node mode"},
		{"dry run", []string{"--nnodes", "2", "--dry-run"}, "run the same command without --nnodes"},
		{"run id", []string{"--nnodes", "2", "--rdzv-id", "../up"}, `--rdzv-id "../up" names the per-node job's run directory`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runGtrain(t, time.Minute, append(slices.Clone(base), tc.args...)...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, want 2 and %q:\n%s", code, tc.want, stderr)
			}
		})
	}
}

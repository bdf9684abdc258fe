package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/enginejob"
	"github.com/gtrain/gtrain/internal/proctest"
	"github.com/gtrain/gtrain/launch"
)

// gtrain_job_info's layout label names the layout the ranks run: planned
// for the attempt (--auto on several hosts, per-node mode, an elastic
// restart) and with dp resolved from the world, not the job file's.

// infoLabel finds each gtrain_job_info series' layout on a metrics page
// (client_golang writes the labels sorted: layout before run_id).
var infoLabel = regexp.MustCompile(`(?m)^gtrain_job_info\{layout="([^"]*)"`)

// infoLayouts are the layouts of a metrics page's job info series.
func infoLayouts(page string) []string {
	var out []string
	for _, m := range infoLabel.FindAllStringSubmatch(page, -1) {
		out = append(out, m[1])
	}
	return out
}

// autoChoice is the layout --auto planned from the hosts' facts, as the
// launcher's notice names it.
var autoChoice = regexp.MustCompile(`from the hosts' reported facts: --auto: tp=(\d+) pp=(\d+).*? dp=(\d+) zero=(\d+) micro_batch=(\d+) grad_accum=(\d+)`)

// layoutJob is a long job whose file leaves dp to the world (dp 0) and
// splits its batch into 8 micro-steps of 1, which --auto on a host with
// memory to spare does not keep.
const layoutJob = `model: {preset: test}
data: {synthetic: 20000}
batch: {micro_batch: 1, grad_accum: 8, seq: 32}
steps: 1000000
optim: {warmup_steps: 2}
checkpoint: {dir: run, every: 1000000}
eval: {every: 0}
threads: 1
`

// TestJobInfoLayoutAuto: `gtrain run --auto --hostfile` (here a hostfile
// of this machine, 2 slots: the agent reports its facts as any host's
// does) serves the layout --auto planned from the host's facts, dp
// resolved, not the job file's (dp 0, micro_batch 1, grad_accum 8),
// which it served before.
func TestJobInfoLayoutAuto(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(layoutJob), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte("localhost slots=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, gtrainBin(t), "run", "--auto", "--hostfile", "hosts", "--job", "job.yaml",
		"--table", "never", "--metrics-addr", "127.0.0.1:0")
	cmd.Dir, cmd.Stdout, cmd.Env = dir, io.Discard, append(os.Environ(), "NO_COLOR=1")
	addr, stderr := stderrLines(t, cmd)
	var page string
	waitFor(t, ctx, func() bool {
		page = scrape(t, ctx, "http://"+addr+"/metrics")
		return rankSeries.MatchString(page)
	})
	interrupt(t, ctx, []*exec.Cmd{cmd})
	m := autoChoice.FindStringSubmatch(stderr())
	if m == nil {
		t.Fatalf("no layout planned from the host's facts:\n%s", stderr())
	}
	want := fmt.Sprintf("dp %s, tp %s, pp %s, ZeRO stage %s, micro_batch %s, grad_accum %s, fp32", m[3], m[1], m[2], m[4], m[5], m[6])
	if got := infoLayouts(page); len(got) != 1 || got[0] != want {
		t.Errorf("gtrain_job_info layouts %q, want the one planned, %q", got, want)
	}
	if strings.Contains(want, "micro_batch 1, grad_accum 8") {
		t.Logf("note: --auto kept the job file's batch split; the test still checks dp resolved")
	}
}

// TestJobInfoLayoutDP0: a job file with dp 0 (every rank) run on 2 ranks
// is served as dp 2, the layout the ranks run; it read "dp 0".
func TestJobInfoLayoutDP0(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	defer cancel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(layoutJob), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, gtrainBin(t), "run", "--nproc-per-node", "2", "--job", "job.yaml",
		"--table", "never", "--metrics-addr", "127.0.0.1:0")
	cmd.Dir, cmd.Stdout, cmd.Env = dir, io.Discard, append(os.Environ(), "NO_COLOR=1")
	addr, _ := stderrLines(t, cmd)
	var page string
	waitFor(t, ctx, func() bool {
		page = scrape(t, ctx, "http://"+addr+"/metrics")
		return len(infoLayouts(page)) > 0
	})
	interrupt(t, ctx, []*exec.Cmd{cmd})
	want := "dp 2, tp 1, pp 1, ZeRO stage 0, micro_batch 1, grad_accum 8, fp32"
	if got := infoLayouts(page); len(got) != 1 || got[0] != want {
		t.Errorf("gtrain_job_info layouts %q, want %q", got, want)
	}
}

// TestJobInfoLayoutReplanned: the layout is served as each attempt is
// planned, through the real planner and exporter: none before the first
// attempt's plan (the world is not known yet), dp 2 with the job's
// micro_batch 3 for the first on 2 ranks, then, once an elastic restart
// re-plans the job on 3 ranks for the same global batch of 6, dp 3 with
// micro_batch 2 — always in one series, the label changing, as an info
// metric's must. The label was the job file's throughout ("dp 0").
func TestJobInfoLayoutReplanned(t *testing.T) {
	plan, exp := replannedJob(t, t.Context())
	page := func() string {
		resp, err := http.Get("http://" + exp.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := infoLayouts(page()); len(got) != 0 {
		t.Errorf("before any attempt was planned: layouts %q, want no job info yet", got)
	}
	for _, a := range []struct {
		attempt, world int
		want           string
	}{
		{0, 2, "dp 2, tp 1, pp 1, ZeRO stage 0, micro_batch 3, grad_accum 1, fp32"},
		{1, 3, "dp 3, tp 1, pp 1, ZeRO stage 0, micro_batch 2, grad_accum 1, fp32"},
	} {
		if _, err := plan(t.Context(), launch.World{Attempt: a.attempt, Size: a.world}); err != nil {
			t.Fatalf("attempt %d: %v", a.attempt, err)
		}
		if got := infoLayouts(page()); len(got) != 1 || got[0] != a.want {
			t.Errorf("attempt %d on %d ranks: layouts %q, want one series, %q", a.attempt, a.world, got, a.want)
		}
	}
}

// TestJobInfoLayoutPrometheus: a real Prometheus scraping the exporter
// every second sees one gtrain_job_info series at a time through an
// elastic re-plan: the layout of attempt 0 (dp 2), then only that of
// attempt 1 (dp 3): the old series ends (Prometheus marks it stale at
// the first scrape without it) rather than stay beside the new one.
func TestJobInfoLayoutPrometheus(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_PROMETHEUS", fmt.Errorf("no prometheus (apt-get install prometheus): %w", err))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a backstop
	defer cancel()
	plan, exp := replannedJob(t, ctx)
	prom := startPrometheus(t, ctx, bin, exp.Addr().String())
	for _, a := range []struct {
		attempt, world int
		want           string
	}{
		{0, 2, "dp 2, tp 1, pp 1, ZeRO stage 0, micro_batch 3, grad_accum 1, fp32"},
		{1, 3, "dp 3, tp 1, pp 1, ZeRO stage 0, micro_batch 2, grad_accum 1, fp32"},
	} {
		if _, err := plan(ctx, launch.World{Attempt: a.attempt, Size: a.world}); err != nil {
			t.Fatalf("attempt %d: %v", a.attempt, err)
		}
		var got []string
		waitFor(t, ctx, func() bool {
			got = prom.layouts(t, "gtrain_job_info")
			return slices.Contains(got, a.want)
		})
		if len(got) != 1 {
			t.Errorf("attempt %d: Prometheus has gtrain_job_info series of layouts %q, want only %q", a.attempt, got, a.want)
		}
	}
}

// layouts are the layout labels of the series an instant query returns.
func (p *prometheus) layouts(t *testing.T, query string) []string {
	t.Helper()
	var out []string
	for _, res := range p.query(t, query) {
		out = append(out, res.Metric["layout"])
	}
	return out
}

// replannedJob prepares a per-node engine job of micro_batch 3 (dp 0)
// whose planning hook names each attempt's layout to an exporter on
// loopback, as the per-node launcher wires them; both end with the test.
func replannedJob(t *testing.T, ctx context.Context) (func(context.Context, launch.World) (launch.Planned, error), *launch.MetricsExporter) {
	t.Helper()
	j, err := enginejob.Fresh(ctx, enginejob.Options{Dir: t.TempDir(), PerNode: true, RunID: "replanned", Ranks: 1,
		Sets: []string{"model.preset=test", "steps=3", "batch.micro_batch=3"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Release)
	layout := &attemptLayout{}
	plan := j.Planner(enginejob.PlanOptions{Layout: layout.planned})
	exp, err := launch.ServeMetrics("127.0.0.1:0", "replanned", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exp.Close() })
	layout.serve(exp)
	return plan, exp
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/proctest"
)

// checkRunMetrics fails t unless the metrics file of the run directory dir
// holds steps 1 to steps once each, in order, with the losses want.
func checkRunMetrics(t *testing.T, dir string, want map[int]float32, steps int) {
	t.Helper()
	next := 1
	err := train.ReadMetrics(filepath.Join(dir, train.MetricsFile), func(m train.MetricsLine) error {
		if m.Step != next || m.Loss != want[m.Step] {
			return fmt.Errorf("record %d: step %d loss %v, want step %d loss %v", next, m.Step, m.Loss, next, want[next])
		}
		next++
		return nil
	})
	if err == nil && next != steps+1 {
		err = fmt.Errorf("%d records, want %d", next-1, steps)
	}
	if err != nil {
		t.Errorf("%s: %v", train.MetricsFile, err)
	}
}

const promJob = `
model: {preset: test}
data: {synthetic: 20000}
batch: {micro_batch: 2, seq: 32}
steps: 1000000
optim: {warmup_steps: 2}
checkpoint: {dir: run, every: 1000000}
eval: {every: 0}
threads: 1
`

var metricsURL = regexp.MustCompile(`Prometheus metrics on http://(127\.0\.0\.1:[0-9]+)/metrics`)

// TestPrometheusScrapesJob: a real Prometheus (Debian's prometheus),
// started with a 1 s scrape interval on loopback, scrapes the endpoint of
// a running two-rank engine job (--metrics-addr 127.0.0.1:0); once it has
// a few scrapes the job is interrupted, and rank 0's loss at the last
// scrape, read back through Prometheus's HTTP API, equals the loss that
// metrics.jsonl has for the step of that scrape.
func TestPrometheusScrapesJob(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_PROMETHEUS", fmt.Errorf("no prometheus (apt-get install prometheus): %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(promJob), 0o644); err != nil {
		t.Fatal(err)
	}
	job := exec.CommandContext(ctx, gtrainBin(t), "run", "--table", "never", "--nproc-per-node", "2",
		"--metrics-addr", "127.0.0.1:0", "--job", "job.yaml")
	job.Dir, job.Stdout = dir, io.Discard
	target := startScanningStderr(t, job)
	prom := startPrometheus(t, ctx, bin, target)
	// A few scrapes of a job with steps: then stop it (SIGINT, as Ctrl-C).
	waitFor(t, ctx, func() bool { return len(prom.samples(t, `gtrain_rank_step{rank="0"}[1m]`)) >= 3 })
	job.Process.Signal(syscall.SIGINT)
	job.Wait()
	loss := prom.samples(t, `gtrain_rank_loss{rank="0"}[5m]`)
	step := prom.samples(t, `gtrain_rank_step{rank="0"}[5m]`)
	lastLoss, lastStep := loss[len(loss)-1], step[len(step)-1]
	if lastLoss.at != lastStep.at {
		t.Fatalf("last loss sample at %v, last step sample at %v: want one scrape", lastLoss.at, lastStep.at)
	}
	n := int(lastStep.v)
	var want *train.MetricsLine
	train.ReadMetrics(filepath.Join(dir, "run", train.MetricsFile), func(m train.MetricsLine) error {
		if m.Step == n {
			want = &m
		}
		return nil
	})
	if want == nil {
		t.Fatalf("metrics.jsonl has no step %d, the last one Prometheus scraped", n)
	}
	if float32(lastLoss.v) != want.Loss {
		t.Errorf("step %d: Prometheus has rank 0's loss %v, metrics.jsonl %v", n, lastLoss.v, want.Loss)
	}
	t.Logf("last scrape: step %d, loss %v", n, lastLoss.v)
}

// startScanningStderr starts cmd and returns the metrics address it
// announces on stderr.
func startScanningStderr(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	addr, _ := stderrLines(t, cmd)
	return addr
}

// stderrLines starts cmd and returns the metrics address it announces on
// stderr and a function giving every stderr line read so far; the lines
// are echoed to the test's stderr as they come.
func stderrLines(t *testing.T, cmd *exec.Cmd) (string, func() string) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var mu sync.Mutex
	var sb strings.Builder
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			sb.WriteString(sc.Text() + "\n")
			mu.Unlock()
			fmt.Fprintln(os.Stderr, sc.Text())
			if m := metricsURL.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		close(addr)
	}()
	a, ok := <-addr
	if !ok {
		t.Fatalf("gtrain run ended without announcing its metrics address:\n%s", sb.String())
	}
	return a, func() string { mu.Lock(); defer mu.Unlock(); return sb.String() }
}

// prometheus is a running Prometheus server.
type prometheus struct{ api string }

// startPrometheus runs Prometheus on a free loopback port, scraping target
// every second, with its data in a temporary directory; it is stopped when
// the test ends.
func startPrometheus(t *testing.T, ctx context.Context, bin, target string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf("global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n  - job_name: gtrain\n    static_configs: [{targets: [%q]}]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackPort(t)
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	out, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p := &prometheus{api: "http://" + addr}
	waitFor(t, ctx, func() bool {
		resp, err := http.Get(p.api + "/-/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	return p
}

// freeLoopbackPort is a loopback address whose port was free a moment ago.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// sample is one stored sample: its scrape time and value.
type sample struct {
	at float64
	v  float64
}

// promResult is one series of an instant query's answer.
type promResult struct {
	Metric map[string]string `json:"metric"`
	Values [][2]any          `json:"values"`
}

// query runs an instant query through /api/v1/query and returns its
// series.
func (p *prometheus) query(t *testing.T, query string) []promResult {
	t.Helper()
	resp, err := http.Get(p.api + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Data   struct {
			Result []promResult `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&r); err != nil || r.Status != "success" {
		t.Fatalf("query %s: status %q, %v", query, r.Status, err)
	}
	return r.Data.Result
}

// samples are the raw samples of a range selector, through /api/v1/query,
// of its one series (none while there is none).
func (p *prometheus) samples(t *testing.T, query string) []sample {
	t.Helper()
	res := p.query(t, query)
	if len(res) > 1 {
		t.Fatalf("query %s: %d series, want one", query, len(res))
	}
	var out []sample
	for _, r := range res {
		for _, v := range r.Values {
			at, _ := v[0].(float64)
			s, _ := v[1].(string)
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("query %s: value %v", query, v[1])
			}
			out = append(out, sample{at, f})
		}
	}
	return out
}

// waitFor polls cond every 100 ms until it holds; ctx is the backstop.
func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting: %v", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

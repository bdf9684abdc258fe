// Package examples_test runs examples/ddp_allreduce.py, a real PyTorch
// distributed job, under gtrain, and under torchrun for comparison. The tests
// need a Python that can import torch; without one they skip, except in CI
// (CI=true) or with GTRAIN_REQUIRE_TORCH=1, where they fail instead so that a
// broken CI image cannot turn them silently green.
package examples_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/proctest"
)

const nproc = 4

// gtrainBin is the gtrain binary built by TestMain.
var gtrainBin string

// script is the absolute path of the example.
var script string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gtrain-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	gtrainBin = filepath.Join(dir, "gtrain")
	build := exec.Command("go", "build", "-o", gtrainBin, "github.com/gtrain/gtrain/cmd/gtrain")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build gtrain: %v\n%s", err, out)
		return 1
	}
	if script, err = filepath.Abs("ddp_allreduce.py"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// cleanEnv is the parent environment of every launcher in these tests: small
// and fixed, so that what a launcher adds stands out. LANG is a UTF-8 locale
// so that Python does not coerce the locale (and set LC_CTYPE) by itself.
func cleanEnv(t *testing.T) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"LANG=C.UTF-8",
		"TMPDIR=" + t.TempDir(), // torchrun's and gtrain's error files land here
	}
	// Whatever the interpreter may need to find torch.
	for _, k := range []string{"PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// result is what one launcher run produced.
type result struct {
	stdout, stderr string
	code           int // exit code; -1 if the process did not exit normally
	elapsed        time.Duration
}

// launch runs name with args in env from an empty working directory (so no
// gtrain.yaml is picked up), killing it after timeout.
func launch(t *testing.T, timeout time.Duration, env []string, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Dir = t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}
	t.Logf("%s %s: %v in %v", filepath.Base(name), strings.Join(args, " "), err, r.elapsed.Round(time.Millisecond))
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s did not finish within %v\nstdout:\n%s\nstderr:\n%s", name, timeout, r.stdout, r.stderr)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

func gtrain(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return launch(t, 2*time.Minute, env, gtrainBin, args...)
}

func TestDDPAllReduce(t *testing.T) {
	py := proctest.NeedTorch(t)
	r := gtrain(t, cleanEnv(t), "run", "--nproc-per-node", strconv.Itoa(nproc), "--", py, script)
	if r.code != 0 {
		t.Fatalf("gtrain exited %d, want 0\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	// gtrain prefixes each line with its rank; the script prints its own.
	okLine := regexp.MustCompile(`(?m)^\[rank (\d+)\] rank (\d+)/(\d+): ok: all_reduce=(\d+) `)
	seen := map[string]bool{}
	for _, m := range okLine.FindAllStringSubmatch(r.stdout, -1) {
		if m[1] != m[2] || m[3] != strconv.Itoa(nproc) || m[4] != strconv.Itoa(nproc*(nproc+1)/2) {
			t.Errorf("bad success line: %q", m[0])
		}
		seen[m[1]] = true
	}
	for rank := range nproc {
		if !seen[strconv.Itoa(rank)] {
			t.Errorf("rank %d printed no success line", rank)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
}

func TestDDPRankFailureReport(t *testing.T) {
	py := proctest.NeedTorch(t)
	const failRank = 2
	// The temp dir in the command line marks the ranks of this job in /proc.
	marker := filepath.Join(t.TempDir(), "env")
	r := gtrain(t, cleanEnv(t), "run", "--nproc-per-node", strconv.Itoa(nproc), "--grace-period", "5s",
		"--", py, script, "--fail-rank", strconv.Itoa(failRank), "--dump-env", marker)
	// The other ranks sleep 600s: only gtrain's teardown lets it return at all.
	if r.code != 1 {
		t.Errorf("gtrain exited %d, want 1 (the failed rank's code)", r.code)
	}
	// Teardown is SIGTERM, which Python obeys at once: far less than the
	// 5s grace period is needed, on top of starting the job.
	if r.elapsed > time.Minute {
		t.Errorf("gtrain took %v to tear the job down, want under a minute", r.elapsed)
	}
	// The report comes from gtrain itself, not just the rank's traceback,
	// and carries the message @record wrote to TORCHELASTIC_ERROR_FILE.
	report := regexp.MustCompile(`(?m)^gtrain: .*\brank ` + strconv.Itoa(failRank) + `\b.*exited with code 1: ValueError: boom$`)
	if !report.MatchString(r.stderr) {
		t.Errorf("stderr has no gtrain report naming rank %d with ValueError: boom", failRank)
	}
	if strings.Contains(r.stdout, ": ok:") {
		t.Errorf("a rank reported success in a job that failed")
	}
	if left := survivors(marker, 5*time.Second); len(left) > 0 {
		t.Errorf("ranks still running after gtrain returned: pids %v", left)
		for _, pid := range left {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
}

// TestHostfileExample keeps hostfile.example in step with the parser. It
// needs no torch.
func TestHostfileExample(t *testing.T) {
	hosts, err := hostfiles.ReadFile(t.Context(), "hostfile.example")
	if err != nil {
		t.Fatal(err)
	}
	want := []hostfiles.Host{
		{Name: "worker-0", Slots: 8},
		{Name: "worker-1", Slots: 8, MaxSlots: 8},
		{Name: "worker-2", Slots: 4},
		{Name: "worker-3", User: "ubuntu", Slots: 4},
		{Name: "10.0.0.14", User: "trainer", Port: 2222, Slots: 2},
		{Name: "fd00::15", Slots: 2},
	}
	if len(hosts) != len(want) {
		t.Fatalf("parsed %d hosts, want %d: %+v", len(hosts), len(want), hosts)
	}
	for i, h := range hosts {
		h.Line = 0
		if h != want[i] {
			t.Errorf("host %d = %+v, want %+v", i, h, want[i])
		}
	}
}

// TestEnvMatchesTorchrun runs the example under torchrun --standalone and
// under gtrain from the same parent environment, and checks that every
// variable torchrun gives a rank, gtrain gives it too, with the same value
// where the value is deterministic. gtrain may add only GTRAIN_* variables.
func TestEnvMatchesTorchrun(t *testing.T) {
	py := proctest.NeedTorch(t)
	env := cleanEnv(t)
	dumps := t.TempDir()
	n := strconv.Itoa(nproc)

	// Debian's torchrun 1.13 crashes on Python 3.11 with its default
	// --redirects; any explicit value avoids the bug.
	tr := launch(t, 2*time.Minute, env, py, "-m", "torch.distributed.run", "--standalone",
		"--nproc_per_node", n, "--redirects", "1", "--tee", "1",
		script, "--dump-env", filepath.Join(dumps, "torchrun"))
	if tr.code != 0 {
		t.Fatalf("torchrun exited %d\nstdout:\n%s\nstderr:\n%s", tr.code, tr.stdout, tr.stderr)
	}
	gt := gtrain(t, env, "run", "--nproc-per-node", n, "--", py, script, "--dump-env", filepath.Join(dumps, "gtrain"))
	if gt.code != 0 {
		t.Fatalf("gtrain exited %d\nstdout:\n%s\nstderr:\n%s", gt.code, gt.stdout, gt.stderr)
	}

	parent := envMap(env)
	errFiles := map[string]int{} // gtrain's TORCHELASTIC_ERROR_FILE → rank
	for rank := range nproc {
		want := modernNames(added(readDump(t, dumps, "torchrun", rank), parent))
		got := added(readDump(t, dumps, "gtrain", rank), parent)
		if diff := envDiff(want, got); len(diff) > 0 {
			t.Errorf("rank %d: environment differs from torchrun's (variables the launcher added or changed):\n  %s",
				rank, strings.Join(diff, "\n  "))
		}
		if f := got["TORCHELASTIC_ERROR_FILE"]; f != "" {
			if other, dup := errFiles[f]; dup {
				t.Errorf("ranks %d and %d share TORCHELASTIC_ERROR_FILE %s", other, rank, f)
			}
			errFiles[f] = rank
		}
	}
}

// modernNames brings an older torchrun's variables to those of the torchrun
// gtrain follows, PyTorch 2.2's and later (2.11's seen beside gtrain's on a
// GPU machine: docs/gpu.md). Before 2.2 the NCCL watchdog's switch was named
// NCCL_ASYNC_ERROR_HANDLING (Debian 12's 1.13), and later torchruns also set
// TORCHELASTIC_SIGNALS_TO_HANDLE to their default list.
func modernNames(want map[string]string) map[string]string {
	const old, async, sigs = "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"
	if v, ok := want[old]; ok {
		if _, ok := want[async]; !ok {
			want[async] = v
			delete(want, old)
		}
	}
	if _, ok := want[sigs]; !ok {
		want[sigs] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
	}
	return want
}

// envDiff compares the variables torchrun added (want) with those gtrain
// added (got) and returns one line per difference.
func envDiff(want, got map[string]string) []string {
	var diff []string
	for _, k := range sortedKeys(want) {
		g, ok := got[k]
		switch {
		case !ok:
			diff = append(diff, fmt.Sprintf("%s: missing under gtrain (torchrun: %q)", k, want[k]))
		case !sameValue(k, want[k], g):
			diff = append(diff, fmt.Sprintf("%s: gtrain %q, torchrun %q", k, g, want[k]))
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok && !strings.HasPrefix(k, "GTRAIN_") {
			diff = append(diff, fmt.Sprintf("%s: added by gtrain only (%q); gtrain may add only GTRAIN_* variables", k, got[k]))
		}
	}
	return diff
}

// sameValue reports whether gtrain's value g of k matches torchrun's value w.
// Ports, run ids and error-file paths are chosen afresh by each launcher.
func sameValue(k, w, g string) bool {
	switch k {
	case "MASTER_PORT":
		return isPort(w) && isPort(g)
	case "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE":
		return w != "" && g != ""
	case "MASTER_ADDR":
		return isLoopback(w) && isLoopback(g)
	}
	return w == g
}

func isPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n > 0 && n <= 65535
}

func isLoopback(s string) bool {
	ip := net.ParseIP(s)
	return s == "localhost" || ip != nil && ip.IsLoopback()
}

// added returns the variables of env that are not in parent or have another
// value there. LC_CTYPE is left out: Python's locale coercion sets it.
func added(env, parent map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		if pv, ok := parent[k]; (!ok || pv != v) && k != "LC_CTYPE" {
			out[k] = v
		}
	}
	return out
}

func readDump(t *testing.T, dir, launcher string, rank int) map[string]string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("%s.%d.json", launcher, rank))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: rank %d wrote no environment: %v", launcher, rank, err)
	}
	var env map[string]string
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return env
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// survivors returns the pids of processes whose command line contains
// marker, waiting up to wait for them to go. It returns nil where there is
// no /proc.
func survivors(marker string, wait time.Duration) []int {
	deadline := time.Now().Add(wait)
	for {
		var pids []int
		paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil || !bytes.Contains(b, []byte(marker)) {
				continue
			}
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 || time.Now().After(deadline) {
			return pids
		}
		time.Sleep(100 * time.Millisecond)
	}
}

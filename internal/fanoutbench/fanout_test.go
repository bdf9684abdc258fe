//go:build fanoutbench

package fanoutbench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
)

// The benchmark's knobs, from the environment (docs/bench/fanout.sh sets
// them): which host counts, how many runs of each kind per count.
const (
	defaultHosts = "1,4,16,32,64"
	defaultRuns  = 3
	maxRuns      = 20
	// maxHostCount is internal/netns's: its hosts share one /24 bridge.
	maxHostCount = 200
)

// TestFanout measures, for each host count N, `gtrain run` of one rank per
// host in four kinds of run, interleaved run by run so that all see the
// same load: cold (the binary is copied to the hosts first), warm (it is
// in the hosts' cache), remote (--remote-gtrain: no check at all) and
// teardown (every rank sleeps; SIGINT once all have started). It prints a
// markdown table of medians.
func TestFanout(t *testing.T) {
	netns.Require(t)
	counts := hostCounts(t)
	runs := envInt(t, "FANOUT_RUNS", defaultRuns, 1, maxRuns)
	// SIGINT or SIGTERM (a user giving up on a long run) fails the run in
	// progress instead of killing the process, so that the cleanups remove
	// the namespaces, their sshds and the cached binary.
	ctx, stop := signal.NotifyContext(t.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bin := buildGtrain(t)
	var rows []row
	for _, n := range counts {
		if ctx.Err() != nil {
			t.Fatalf("fanoutbench: interrupted before %d hosts", n)
		}
		ok := t.Run("hosts="+strconv.Itoa(n), func(t *testing.T) {
			rows = append(rows, measureHosts(ctx, t, bin, n, runs))
		})
		if ok {
			// Every count's table as soon as it is done: a long run
			// stopped later still leaves its numbers.
			fmt.Print(table(rows, runs))
		}
	}
}

// measureHosts makes a cluster of n hosts and measures every kind of run
// on it runs times; the cluster is removed when the subtest ends, also
// when it fails.
func measureHosts(ctx context.Context, t *testing.T, bin *gtrainBin, n, runs int) row {
	c := netns.New(t, n)
	hs := handshakes(t, c)
	r := row{hosts: n, hs: hs}
	for i := range runs {
		if ctx.Err() != nil {
			t.Fatalf("fanoutbench: interrupted at %d hosts, run %d", n, i+1)
		}
		r.cold = append(r.cold, launch(ctx, t, bin, c, kindCold))
		r.warm = append(r.warm, launch(ctx, t, bin, c, kindWarm))
		r.remote = append(r.remote, launch(ctx, t, bin, c, kindRemote))
		r.sleep = append(r.sleep, launch(ctx, t, bin, c, kindSleep))
		t.Logf("hosts=%d run %d: cold %v, warm %v, remote %v to all ranks started; teardown %v",
			n, i+1, ms(r.cold[i].started), ms(r.warm[i].started), ms(r.remote[i].started), ms(r.sleep[i].teardown))
	}
	return r
}

// hostCounts parses FANOUT_HOSTS, e.g. "1,4,16,32".
func hostCounts(t *testing.T) []int {
	s := os.Getenv("FANOUT_HOSTS")
	if s == "" {
		s = defaultHosts
	}
	var counts []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxHostCount {
			t.Fatalf("fanoutbench: FANOUT_HOSTS=%q: %q is not a host count from 1 to %d", s, f, maxHostCount)
		}
		counts = append(counts, n)
	}
	return counts
}

// envInt reads a whole number from name, def when unset.
func envInt(t *testing.T, name string, def, lo, hi int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		t.Fatalf("fanoutbench: %s=%q: want a number from %d to %d", name, s, lo, hi)
	}
	return n
}

// gtrainBin is the binary under measurement and its place in the hosts'
// cache (the hosts share this machine's file system and root's home).
type gtrainBin struct {
	path   string
	cached string
}

// buildGtrain builds gtrain with a version of its own, so that its content
// hash, and so its entry in ~/.cache/gtrain, is this benchmark's alone:
// the cold runs delete that entry, which must not pull the binary from
// under another test's job. The entry is removed at the end.
func buildGtrain(t *testing.T) *gtrainBin {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("fanoutbench: find the module root (go env GOMOD): %v", err)
	}
	path := filepath.Join(t.TempDir(), "gtrain")
	cmd := exec.Command("go", "build", "-o", path, "-ldflags=-X main.version=fanout-bench", "./cmd/gtrain")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fanoutbench: go build gtrain: %v\n%s", err, b)
	}
	hash, err := fileHash(path)
	if err != nil {
		t.Fatalf("fanoutbench: %v", err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatalf("fanoutbench: %v", err)
	}
	// launch.cachedName's layout: gtrain-<first 16 hex digits of sha256>.
	b := &gtrainBin{path: path, cached: filepath.Join(u.HomeDir, ".cache", "gtrain", "gtrain-"+hash[:16])}
	t.Cleanup(func() { _ = os.Remove(b.cached) })
	return b
}

func fileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// row is every sample taken at one host count.
type row struct {
	hosts                     int
	hs                        handshakeSample
	cold, warm, remote, sleep []sample
}

// table formats the medians of every row as markdown: wall times, then
// what the launcher spent.
func table(rows []row, runs int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nMedians of %d runs, milliseconds since the launcher started; one rank per host.\n\n", runs)
	b.WriteString("| hosts | cold: ranks started | warm: joined | warm: ranks started | warm: exited | remote: ranks started | last agent up | teardown | teardown: last rank exited |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.hosts,
			med(r.cold, func(s sample) int64 { return s.started.Milliseconds() }),
			med(r.warm, func(s sample) int64 { return s.joined.Milliseconds() }),
			med(r.warm, func(s sample) int64 { return s.started.Milliseconds() }),
			med(r.warm, func(s sample) int64 { return s.exited.Milliseconds() }),
			med(r.remote, func(s sample) int64 { return s.started.Milliseconds() }),
			med(r.sleep, func(s sample) int64 { return s.agentsUp.Milliseconds() }),
			med(r.sleep, func(s sample) int64 { return s.teardown.Milliseconds() }),
			med(r.sleep, func(s sample) int64 { return s.lastExit.Milliseconds() }))
	}
	b.WriteString("\n| hosts | launcher CPU ms: cold | warm | remote | launcher RSS MiB | launcher fds | agent RSS MiB | handshakes: all hosts ms | CPU ms/host | heap KiB/conn | goroutines/conn |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %d | %.2f | %.0f | %.1f |\n", r.hosts,
			med(r.cold, func(s sample) int64 { return s.cpu.Milliseconds() }),
			med(r.warm, func(s sample) int64 { return s.cpu.Milliseconds() }),
			med(r.remote, func(s sample) int64 { return s.cpu.Milliseconds() }),
			med(r.sleep, func(s sample) int64 { return s.rssKiB / 1024 }),
			med(r.sleep, func(s sample) int64 { return int64(s.fds) }),
			med(r.sleep, func(s sample) int64 { return s.agentRSSKiB / 1024 }),
			r.hs.wall.Milliseconds(), float64(r.hs.cpu.Microseconds())/1000/float64(r.hosts),
			r.hs.heapPerConn/1024, r.hs.goroutinesPerConn)
	}
	return b.String()
}

// med is the median of f over ss (the upper one of an even count).
func med(ss []sample, f func(sample) int64) string {
	if len(ss) == 0 {
		return "–"
	}
	v := make([]int64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	return strconv.FormatInt(v[len(v)/2], 10)
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

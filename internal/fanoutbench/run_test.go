//go:build fanoutbench

package fanoutbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/launch/proto"
)

// kind is what one measured run does.
type kind int

const (
	kindCold   kind = iota // `true`, the binary deleted from the hosts' cache first
	kindWarm               // `true`, the binary already cached
	kindRemote             // `true` with --remote-gtrain: no check, no copy
	kindSleep              // `sleep`, interrupted once every rank has started
)

// runBackstop bounds one run; a run never comes near it unless gtrain hangs.
const runBackstop = 10 * time.Minute

// sample is one run, times since the launcher was started.
type sample struct {
	joined   time.Duration // the last agent's joined event (after the rendezvous round)
	started  time.Duration // the last rank_started event
	exited   time.Duration // the launcher exited
	agentsUp time.Duration // the last agent process started (kindSleep, /proc, 10 ms ticks)
	teardown time.Duration // SIGINT to the launcher's exit (kindSleep)
	lastExit time.Duration // SIGINT to the last rank_exited event (kindSleep)

	cpu         time.Duration // the launcher's user+system CPU
	rssKiB      int64         // the launcher's peak RSS
	fds         int           // the launcher's open files once every rank ran (kindSleep)
	agentRSSKiB int64         // the mean agent RSS once every rank ran (kindSleep)
}

// launch runs gtrain once over every host of c and times it from its JSON
// events.
func launch(ctx context.Context, t *testing.T, bin *gtrainBin, c *netns.Cluster, k kind) sample {
	t.Helper()
	// --join-timeout and --heartbeat: every host here shares this
	// machine's cores, so a hundred agents can take longer than the
	// default minute to join, and one can be silent (detecting its host)
	// for longer than the default 25 s.
	args := []string{"run", "--hostfile", c.Hostfile(1), "--output", "json", "--table", "never",
		"--identity", c.IdentityFile, "--ssh-known-hosts", c.KnownHosts, "--ssh-config", "none",
		"--join-timeout", "5m", "--heartbeat", "30s"}
	switch k {
	case kindCold:
		if err := os.Remove(bin.cached); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("fanoutbench: empty the hosts' cache: %v", err)
		}
	case kindRemote:
		args = append(args, "--remote-gtrain", bin.cached)
	}
	rank := []string{"true"}
	if k == kindSleep {
		rank = []string{"sleep", "600"}
	}
	args = append(append(args, "--"), rank...)
	ctx, cancel := context.WithTimeout(ctx, runBackstop)
	defer cancel()
	j := startJob(ctx, t, bin.path, args, len(c.Hosts))
	if k == kindSleep {
		return j.interrupt(t)
	}
	return j.wait(t)
}

// job is a running launcher and what its events said so far.
type job struct {
	cmd        *exec.Cmd
	t0         time.Time
	startTicks int64 // the launcher's start, in clock ticks since boot
	stderr     *strings.Builder
	said       strings.Builder  // notices, errors and job_exited, from the events
	events     chan proto.Event // every event, then closed at end of stdout
	exited     chan time.Time   // when Wait returned
	hosts      int
	joined     time.Time
	started    time.Time
	nStarted   int
	agentPIDs  []int
	rankPIDs   []int
	lastExit   time.Time
	waitErr    error
}

func startJob(ctx context.Context, t *testing.T, bin string, args []string, hosts int) *job {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	j := &job{cmd: cmd, stderr: &strings.Builder{}, events: make(chan proto.Event, 1024),
		exited: make(chan time.Time, 1), hosts: hosts}
	cmd.Stderr = j.stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	j.t0 = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("fanoutbench: start gtrain: %v", err)
	}
	w.Close()
	j.startTicks, _ = procStart(cmd.Process.Pid)
	go readEvents(r, j.events)
	go func() { j.waitErr = cmd.Wait(); j.exited <- time.Now() }()
	return j
}

// readEvents decodes the launcher's JSON lines until its stdout closes.
func readEvents(r *os.File, out chan<- proto.Event) {
	defer close(out)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev proto.Event
		if json.Unmarshal(sc.Bytes(), &ev) == nil {
			out <- ev
		}
	}
}

// note records what ev says of the start-up; it reports whether every rank
// has started.
func (j *job) note(ev proto.Event) bool {
	switch ev.Type {
	case proto.EventJoined:
		if ev.Time.After(j.joined) {
			j.joined = ev.Time
		}
		if ev.Facts != nil {
			j.agentPIDs = append(j.agentPIDs, ev.Facts.PID)
		}
	case proto.EventRankStarted:
		j.nStarted++
		j.rankPIDs = append(j.rankPIDs, ev.PID)
		if ev.Time.After(j.started) {
			j.started = ev.Time
		}
		return j.nStarted == j.hosts
	case proto.EventRankExited:
		if ev.Time.After(j.lastExit) {
			j.lastExit = ev.Time
		}
	case proto.EventNotice, proto.EventError, proto.EventJobExited:
		// With --output json, gtrain says why it failed here, not on stderr.
		j.said.WriteString(ev.Type + ": " + ev.Host + " " + ev.Message + "\n")
	}
	return false
}

// wait reads events to the end and the launcher's exit.
func (j *job) wait(t *testing.T) sample {
	t.Helper()
	for ev := range j.events {
		j.note(ev)
	}
	end := <-j.exited
	j.check(t, 0)
	return j.sample(end)
}

// interrupt waits until every rank has started, measures the launcher and
// the agents then, sends SIGINT and times the teardown. It fails the test if
// a rank survives the launcher.
func (j *job) interrupt(t *testing.T) sample {
	t.Helper()
	all := false
	for ev := range j.events {
		if j.note(ev) {
			all = true
			break
		}
	}
	if !all {
		<-j.exited
		t.Fatalf("fanoutbench: gtrain ended with %d of %d ranks started: %v\n%s%s", j.nStarted, j.hosts, j.waitErr, &j.said, j.stderr)
	}
	s := sample{fds: countFDs(j.cmd.Process.Pid)}
	s.agentsUp, s.agentRSSKiB = j.agents(t)
	ranks := rankStarts(j.rankPIDs)
	sig := time.Now()
	if err := j.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("fanoutbench: interrupt gtrain: %v", err)
	}
	for ev := range j.events {
		j.note(ev)
	}
	end := <-j.exited
	j.check(t, 130)
	for pid, ticks := range ranks {
		if now, ok := procStart(pid); ok && now == ticks {
			t.Errorf("fanoutbench: rank pid %d still runs after the launcher exited", pid)
		}
	}
	got := j.sample(end)
	got.fds, got.agentsUp, got.agentRSSKiB = s.fds, s.agentsUp, s.agentRSSKiB
	got.teardown, got.lastExit = end.Sub(sig), j.lastExit.Sub(sig)
	return got
}

// check fails the test unless the launcher exited with want.
func (j *job) check(t *testing.T, want int) {
	t.Helper()
	code := 0
	var ee *exec.ExitError
	if errors.As(j.waitErr, &ee) {
		code = ee.ExitCode()
	} else if j.waitErr != nil {
		t.Fatalf("fanoutbench: gtrain: %v", j.waitErr)
	}
	if code != want || j.nStarted != j.hosts {
		t.Fatalf("fanoutbench: gtrain exited %d (want %d) with %d of %d ranks started\n%sstderr:\n%s", code, want, j.nStarted, j.hosts, &j.said, j.stderr)
	}
}

func (j *job) sample(end time.Time) sample {
	s := sample{joined: j.joined.Sub(j.t0), started: j.started.Sub(j.t0), exited: end.Sub(j.t0)}
	if ru, ok := j.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		s.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		s.rssKiB = ru.Maxrss
	}
	return s
}

// agents returns when the last agent process started, since the launcher
// did, and the agents' mean RSS.
func (j *job) agents(t *testing.T) (time.Duration, int64) {
	t.Helper()
	var last, rss int64
	for _, pid := range j.agentPIDs {
		ticks, ok := procStart(pid)
		if !ok {
			t.Fatalf("fanoutbench: agent pid %d is not running while its rank is", pid)
		}
		last = max(last, ticks-j.startTicks)
		rss += procRSS(pid)
	}
	if len(j.agentPIDs) != j.hosts {
		t.Fatalf("fanoutbench: %d joined events with facts, want %d", len(j.agentPIDs), j.hosts)
	}
	return time.Duration(last) * time.Second / clockTicks, rss / int64(len(j.agentPIDs))
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's start time: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// procStart returns pid's start time in clock ticks since boot.
func procStart(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces and parentheses: count fields after
	// the last ')'. starttime is field 22, the 20th after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseInt(f[19], 10, 64)
	return v, err == nil
}

// rankStarts maps each rank's pid to its start time, to tell it from a
// later process that reuses the pid.
func rankStarts(pids []int) map[int]int64 {
	m := map[int]int64{}
	for _, pid := range pids {
		if v, ok := procStart(pid); ok {
			m[pid] = v
		}
	}
	return m
}

// procRSS is pid's resident set in KiB (0 if gone).
func procRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func countFDs(pid int) int {
	d, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return 0
	}
	return len(d)
}

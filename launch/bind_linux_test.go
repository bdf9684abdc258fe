package launch

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpusAllowed parses the Cpus_allowed_list lines of a rank's output.
func cpusAllowed(t *testing.T, lines []string) []string {
	t.Helper()
	var out []string
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// TestBindCoreRanksDisjoint runs two real ranks under --bind core: each
// reads its own Cpus_allowed_list, once started and again once both are
// up, and the two sets are disjoint and within this process's CPUs. The
// ranks meet through files, so both are alive after both were started:
// a rank killed when the thread that started it ends (Pdeathsig follows
// the thread) fails the job.
func TestBindCoreRanksDisjoint(t *testing.T) {
	own := processAffinity()
	if len(own) < 2 {
		t.Skipf("this process may use %d CPU(s): two ranks cannot each have their own", len(own))
	}
	dir := t.TempDir()
	script := `grep Cpus_allowed_list /proc/self/status; echo "OMP_NUM_THREADS=$OMP_NUM_THREADS GTRAIN_CPUS=$GTRAIN_CPUS"
touch "$D/up-$RANK"
i=0; until [ -e "$D/up-0" ] && [ -e "$D/up-1" ]; do i=$((i+1)); [ $i -gt 6000 ] && exit 3; sleep 0.01; done
grep Cpus_allowed_list /proc/self/status`
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	t.Setenv("D", dir)
	p, err := NewJob(JobOptions{Nodes: localNodes(2), Command: []string{"sh", "-c", script}, Grace: time.Second,
		Heartbeat: time.Second, Bind: BindCore, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), p, Runtime{Transport: &Local{Exe: os.Args[0]}, View: rec, AgentGrace: 5 * time.Second})
	}()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("job did not finish within 60s")
	}
	if err != nil {
		t.Fatalf("job failed: %v\nrank 0: %q\nrank 1: %q", err, rec.lines(0), rec.lines(1))
	}
	// The agent's join carried what it detected, and the job kept it.
	if facts := p.HostFacts(); len(facts) != 1 || facts[0] == nil || len(facts[0].CPU.Online) == 0 {
		t.Errorf("job's host facts %+v: want this machine's, from the agent's join", facts)
	}
	var sets [2][]int
	for r := range 2 {
		lists := cpusAllowed(t, rec.lines(r))
		if len(lists) != 2 || lists[0] != lists[1] {
			t.Fatalf("rank %d: Cpus_allowed_list %q, want the same list twice", r, lists)
		}
		sets[r] = parseCPUList(t, lists[0])
		if !slices.Contains(rec.lines(r), "OMP_NUM_THREADS="+strconv.Itoa(len(sets[r]))+" GTRAIN_CPUS="+strconv.Itoa(len(sets[r]))) {
			t.Errorf("rank %d: output %q lacks OMP_NUM_THREADS and GTRAIN_CPUS = %d, its CPUs", r, rec.lines(r), len(sets[r]))
		}
		for _, c := range sets[r] {
			if !slices.Contains(own, c) {
				t.Errorf("rank %d: CPU %d is not one this process may use (%v)", r, c, own)
			}
		}
	}
	for _, c := range sets[0] {
		if slices.Contains(sets[1], c) {
			t.Errorf("ranks 0 (%v) and 1 (%v) share CPU %d", sets[0], sets[1], c)
		}
	}
}

// TestStartBoundSetsPolicy starts a process bound to one CPU with memory
// preferred on node 0: it runs on that CPU alone, with the preferred
// policy (numa_maps shows "prefer:0"), and this process is left unbound.
func TestStartBoundSetsPolicy(t *testing.T) {
	own := processAffinity()
	if len(own) == 0 {
		t.Fatal("no CPU affinity")
	}
	cpu := own[len(own)-1]
	cmd := exec.Command("sh", "-c", "grep Cpus_allowed_list /proc/self/status; head -1 /proc/self/numa_maps")
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	hold := make(chan struct{})
	var warned []string
	if err := startBound(cmd, &Binding{CPUs: []int{cpu}, MemNode: 0}, func(m string) { warned = append(warned, m) }, hold); err != nil {
		t.Fatal(err)
	}
	werr := cmd.Wait()
	close(hold)
	b, _ := os.ReadFile(out.Name())
	if werr != nil {
		t.Fatalf("%v: %s", werr, b)
	}
	if !strings.Contains(string(b), "Cpus_allowed_list:\t"+strconv.Itoa(cpu)+"\n") {
		t.Errorf("child's status %q: want Cpus_allowed_list %d alone", b, cpu)
	}
	if len(warned) == 0 && !strings.Contains(string(b), "prefer:0") {
		t.Errorf("child's numa_maps %q: want the policy prefer:0", b)
	}
	if got := processAffinity(); !slices.Equal(got, own) {
		t.Errorf("this process's CPUs changed from %v to %v", own, got)
	}
}

// parseCPUList reads a Linux CPU list ("0-2,5").
func parseCPUList(t *testing.T, s string) []int {
	t.Helper()
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, ok := strings.Cut(part, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || b < a {
			t.Fatalf("bad CPU list %q", s)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out
}

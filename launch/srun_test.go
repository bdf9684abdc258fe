package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
)

// fakeSrun writes an srun that logs its arguments, one call per line, to
// the returned log and runs the command after its options (the agent):
// a stand-in for the real srun where Slurm is not running.
func fakeSrun(t *testing.T) (path, log string) {
	t.Helper()
	dir := t.TempDir()
	path, log = filepath.Join(dir, "srun"), filepath.Join(dir, "srun.log")
	script := `#!/bin/sh
echo "$*" >> "` + log + `"
while [ $# -gt 0 ]; do
	case "$1" in --*) shift ;; *) break ;; esac
done
exec "$@"
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, log
}

// srunNodes is a job of one rank on each of two hosts that are not this
// machine (so their agents get the address srun's route found).
func srunNodes() []hostfiles.Node {
	return []hostfiles.Node{
		{Host: hostfiles.Host{Name: "node-a", Slots: 1}, SlotIDs: []int{0}},
		{Host: hostfiles.Host{Name: "node-b", Slots: 1}, SlotIDs: []int{0}},
	}
}

// runSrunJob runs script as the ranks of twoNodes through Srun with the
// fake srun; it returns the events, the error and srun's calls.
func runSrunJob(t *testing.T, script string) (*recorder, error, []string) {
	t.Helper()
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	srun, log := fakeSrun(t)
	p, err := NewJob(JobOptions{Nodes: srunNodes(), Command: []string{"sh", "-c", script}, Grace: time.Second, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tr := &Srun{Exe: os.Args[0], Srun: srun, JobID: "77",
		NodeAddr: func(context.Context, string) (string, error) { return "127.0.0.1", nil }}
	rec := &recorder{}
	done := make(chan error, 1)
	go func() {
		done <- Run(t.Context(), p, Runtime{Transport: tr, View: rec, AgentGrace: 5 * time.Second, RendezvousBind: "127.0.0.1:0"})
	}()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute): // backstop
		t.Fatal("job did not finish within 2 minutes")
	}
	b, rerr := os.ReadFile(log)
	if rerr != nil {
		t.Fatalf("srun was never called: %v", rerr)
	}
	return rec, err, strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestSrunTransport: each host's agent is one srun of one task on that
// node, in the allocation, overlapping, killed on a bad exit, named after
// the run; the agents join the rendezvous at the address that routes to
// their node and the ranks get that node's address as MASTER_ADDR.
func TestSrunTransport(t *testing.T) {
	rec, err, calls := runSrunJob(t, `echo "master=$MASTER_ADDR rank=$RANK"`)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(calls) != 2 {
		t.Fatalf("srun called %d times, want 2: %q", len(calls), calls)
	}
	slices.Sort(calls)
	for i, node := range []string{"node-a", "node-b"} {
		for _, want := range []string{"--jobid=77", "--nodes=1", "--ntasks=1", "--nodelist=" + node, "--overlap",
			"--kill-on-bad-exit=1", "--quit-on-interrupt", "--job-name=gtrain-", os.Args[0] + " agent"} {
			if !strings.Contains(calls[i], want) {
				t.Errorf("srun call %q lacks %q", calls[i], want)
			}
		}
	}
	for r := range 2 {
		if got := rec.lines(r); !slices.Contains(got, "master=127.0.0.1 rank="+string(rune('0'+r))) {
			t.Errorf("rank %d printed %q, want master=127.0.0.1", r, got)
		}
	}
}

// TestSrunTransportFailure: a rank failing on one node stops the other
// node's rank, through its srun, and is reported with its code.
func TestSrunTransportFailure(t *testing.T) {
	dir := t.TempDir()
	// Rank 1 fails once rank 0 has started (a file, not a sleep), and rank
	// 0 then waits to be stopped.
	script := `if [ "$RANK" = 0 ]; then touch ` + dir + `/started; exec sleep 600; fi
while [ ! -e ` + dir + `/started ]; do sleep 0.05; done; exit 3`
	rec, err, calls := runSrunJob(t, script)
	var rf *RankFailedError
	if !errors.As(err, &rf) || rf.Rank != 1 || rf.Code != 3 {
		t.Fatalf("Run error = %v, want rank 1 failed with code 3", err)
	}
	if len(calls) != 2 {
		t.Fatalf("srun called %d times, want 2", len(calls))
	}
	exits := rec.ofType(proto.EventRankExited)
	if len(exits) != 2 {
		t.Fatalf("%d rank exits, want 2", len(exits))
	}
	for _, ev := range exits {
		if ev.Rank == 0 && !ev.Killed {
			t.Errorf("rank 0 exit %+v: want stopped by the teardown", ev)
		}
	}
}

func TestParseNodeAddr(t *testing.T) {
	out := []byte("NodeName=node1 Arch=x86_64 CoresPerSocket=1 \n   NodeAddr=10.0.0.1 NodeHostName=node1 Version=22.05.8\n")
	if got := parseNodeAddr(out); got != "10.0.0.1" {
		t.Fatalf("parseNodeAddr = %q", got)
	}
	if got := parseNodeAddr([]byte("Node x not found\n")); got != "" {
		t.Fatalf("parseNodeAddr of an error = %q", got)
	}
}

// TestRequestSlurm: inside an allocation a job with no hostfile runs on its
// nodes, started with srun; --hostfile slurm outside one is a usage error;
// --hosts names hosts without a file; --launcher ssh keeps SSH.
func TestRequestSlurm(t *testing.T) {
	alloc := map[string]string{"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "2"}
	getenv := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	r := &Request{Getenv: getenv(alloc)}
	nodes, fromFile, err := r.Nodes(t.Context(), 1)
	if err != nil || !fromFile || len(nodes) != 2 || nodes[0].Name != "n1" || !slices.Equal(nodes[1].SlotIDs, []int{0, 1}) {
		t.Fatalf("Nodes in an allocation = %+v, %v, %v; want n1, n2 with 2 slots each", nodes, fromFile, err)
	}
	if !r.MultiHost() {
		t.Error("a job on the allocation is not MultiHost")
	}
	if tr, err := r.transport(&Local{}, &SSH{}); err != nil {
		t.Fatal(err)
	} else if s, ok := tr.(*Srun); !ok || s.JobID != "9" {
		t.Errorf("transport in an allocation = %T, want *Srun of job 9", tr)
	}
	r.Launcher = LauncherSSH
	if tr, _ := r.transport(&Local{}, &SSH{}); !isMux(tr) {
		t.Errorf("--launcher ssh: transport %T, want the SSH mux", tr)
	}

	out := &Request{Getenv: getenv(nil), Hostfile: HostfileSlurm}
	_, _, err = out.Nodes(t.Context(), 1)
	var ue *usage.Error
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "not inside a Slurm allocation") {
		t.Fatalf("--hostfile slurm outside: %v, want a usage error", err)
	}
	out = &Request{Getenv: getenv(nil), Launcher: LauncherSrun}
	if _, err := out.transport(&Local{}, &SSH{}); !errors.As(err, &ue) {
		t.Fatalf("--launcher srun outside: %v, want a usage error", err)
	}
	if tr, _ := (&Request{Getenv: getenv(nil)}).transport(&Local{}, &SSH{}); !isMux(tr) {
		t.Errorf("outside an allocation: transport %T, want the SSH mux", tr)
	}

	hosts := &Request{Getenv: getenv(alloc), Hosts: "w[1-3]"}
	nodes, _, err = hosts.Nodes(t.Context(), 4)
	if err != nil || len(nodes) != 3 || nodes[2].Name != "w3" || len(nodes[2].SlotIDs) != 4 {
		t.Fatalf("--hosts w[1-3] --nproc-per-node 4 = %+v, %v", nodes, err)
	}
	if tr, _ := hosts.transport(&Local{}, &SSH{}); !isMux(tr) {
		t.Errorf("--hosts: transport %T, want the SSH mux", tr)
	}
	both := &Request{Hosts: "a", Hostfile: "f"}
	if _, _, err := both.Nodes(t.Context(), 1); !errors.As(err, &ue) {
		t.Fatalf("--hosts with --hostfile: %v, want a usage error", err)
	}
	if _, err := (&Request{Launcher: "pbs"}).transport(nil, nil); err == nil || !strings.Contains(err.Error(), "want auto, ssh or srun") {
		t.Fatalf("--launcher pbs: %v", err)
	}
}

func isMux(tr Transport) bool {
	_, ok := tr.(*Mux)
	return ok
}

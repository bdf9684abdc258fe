package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/slurmtest"
	"github.com/gtrain/gtrain/launch"
)

// TestSlurmHostsCheck: inside an sbatch job of two nodes on a real Slurm,
// where SSH between the nodes is not set up (no identity, no known host
// key), `gtrain hosts check --hostfile slurm` reaches node h1 with srun
// as gtrain run starts its agents there: h1 is reached ("srun"), gtrain
// found at this binary's path and its hardware detected, h1 reaches node
// 0 (the batch script's node), and the check exits 0; hosts topology
// detects both nodes likewise. --launcher ssh still uses SSH, which
// fails on h1's unknown host key (exit 1).
func TestSlurmHostsCheck(t *testing.T) {
	c := slurmtest.New(t, 2)
	bin, dir := gtrainBin(t), t.TempDir()
	known := filepath.Join(dir, "known_hosts") // empty: no host is trusted over SSH
	if err := os.WriteFile(known, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Each command's output in its own files, its exit code in NAME.code.
	ssh := fmt.Sprintf("--ssh-config none --ssh-known-hosts %s --ssh-timeout 60s", known)
	script := fmt.Sprintf(`%[1]s hosts check --hostfile slurm %[2]s -o json > auto.json 2> auto.err; echo $? > auto.code
%[1]s hosts check --hostfile slurm --launcher ssh %[2]s -o json > ssh.json 2> ssh.err; echo $? > ssh.code
%[1]s hosts topology --hostfile slurm %[2]s -o json > topology.json 2> topology.err; echo $? > topology.code
`, bin, ssh)
	j := submit(t, c, dir, "hosts", script, "--ntasks-per-node=1")
	if code := j.wait(t, c, 4*time.Minute); code != 0 {
		t.Fatalf("job exit %d:\n%s", code, j.output())
	}

	auto := readHostsCheck(t, dir, "auto", 0)
	h1 := auto[1]
	if h1.Host != "h1" || h1.Reach != (launch.CheckResult{State: launch.CheckOK, Detail: "srun"}) ||
		h1.Auth.State != launch.CheckSkipped || h1.HostKey.State != launch.CheckSkipped {
		t.Errorf("h1 with --launcher auto: %+v, want reached by srun, no login or host key checked", h1)
	}
	if h1.Gtrain.State != launch.CheckOK || h1.GtrainPath != bin || h1.Facts == nil || h1.Master.State != launch.CheckOK || !h1.OK {
		t.Errorf("h1 with --launcher auto: %+v, want gtrain %s found, its hardware detected and node 0 reached", h1, bin)
	}
	sshed := readHostsCheck(t, dir, "ssh", 1)
	if hk := sshed[1].HostKey; hk.State != launch.CheckFailed {
		t.Errorf("h1 with --launcher ssh: host key %+v, want the unknown key refused (SSH, not srun)", hk)
	}

	if code := readFile(t, dir, "topology.code"); code != "0" {
		t.Fatalf("hosts topology: exit %s\n%s", code, readFile(t, dir, "topology.err"))
	}
	var top struct{ Nodes int }
	if err := json.Unmarshal([]byte(readFile(t, dir, "topology.json")), &top); err != nil || top.Nodes != 2 {
		t.Errorf("hosts topology: %v, %d nodes, want 2:\n%s", err, top.Nodes, readFile(t, dir, "topology.json"))
	}
}

// readHostsCheck reads the reports of the hosts check the batch script
// ran as name, which must have exited want, and of both nodes.
func readHostsCheck(t *testing.T, dir, name string, want int) []launch.HostReport {
	t.Helper()
	if code := readFile(t, dir, name+".code"); code != fmt.Sprint(want) {
		t.Fatalf("hosts check (%s): exit %s, want %d\n%s\n%s", name, code, want, readFile(t, dir, name+".json"), readFile(t, dir, name+".err"))
	}
	var doc struct{ Hosts []launch.HostReport }
	if err := json.Unmarshal([]byte(readFile(t, dir, name+".json")), &doc); err != nil || len(doc.Hosts) != 2 {
		t.Fatalf("hosts check (%s): %v, %d hosts, want 2:\n%s", name, err, len(doc.Hosts), readFile(t, dir, name+".json"))
	}
	return doc.Hosts
}

// readFile is the content of dir/name, without surrounding space.
func readFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

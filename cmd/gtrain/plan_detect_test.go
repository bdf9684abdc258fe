package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
)

// TestPlanDetect: gtrain plan --hostfile H --detect plans for the hosts as
// their agents report themselves over SSH (here: CPU hosts, one rank per
// NUMA node), starting no rank; without --hostfile it is a usage error.
func TestPlanDetect(t *testing.T) {
	c := netns.New(t, 2)
	args := []string{"plan", "--hostfile", c.Hostfile(1), "--detect", "--identity", c.IdentityFile, "--ssh-known-hosts", c.KnownHosts,
		"--ssh-config", "none", "--model", "gpt2", "--global-batch", "16", "--precision", "fp32", "-o", "json"}
	code, out, stderr := runGtrain(t, 120*time.Second, args...)
	if code != 0 {
		t.Fatalf("gtrain plan --detect: exit %d\n%s\n%s", code, out, stderr)
	}
	var doc struct {
		Topology struct {
			Nodes int `json:"nodes"`
			GPU   struct {
				Name string `json:"name"`
			} `json:"gpu"`
		} `json:"topology"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("plan JSON: %v\n%s", err, out)
	}
	if doc.Topology.Nodes != 2 || !strings.Contains(doc.Topology.GPU.Name, "cpu") {
		t.Errorf("planned for %d nodes of %q, want the 2 detected CPU hosts\n%s", doc.Topology.Nodes, doc.Topology.GPU.Name, out)
	}
	code, _, stderr = runGtrain(t, 30*time.Second, "plan", "--detect", "--model", "gpt2", "--gpus", "8")
	if code != ExitUsage || !strings.Contains(stderr, "--detect asks a hostfile's hosts what they are: give --hostfile") {
		t.Errorf("plan --detect without --hostfile: exit %d, want %d with the reason\n%s", code, ExitUsage, stderr)
	}
}

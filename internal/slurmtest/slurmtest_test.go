package slurmtest

import (
	"slices"
	"strings"
	"testing"
)

// TestCluster: a 2-node job step runs on both nodes, each under its own
// host name.
func TestCluster(t *testing.T) {
	c := New(t, 2)
	ctx := t.Context()
	out, err := c.Command(ctx, "srun", "--nodes=2", "--ntasks-per-node=1", "--time=5", "hostname").CombinedOutput()
	if err != nil {
		t.Fatalf("srun: %v\n%s\n%s", err, out, c.Logs())
	}
	got := strings.Fields(string(out))
	slices.Sort(got)
	if !slices.Equal(got, []string{"h0", "h1"}) {
		t.Fatalf("srun hostname printed %q, want h0 and h1", got)
	}
}

package hostfiles

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/usage"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestSlurmHosts: the allocation's nodes in order, with slots from
// --nproc-per-node, else GPUs on the node, else tasks per node.
func TestSlurmHosts(t *testing.T) {
	alloc := func(extra map[string]string) map[string]string {
		m := map[string]string{SlurmJobID: "42", SlurmJobNodelist: "node[01-02],gpu-7", SlurmNNodes: "3"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name  string
		env   map[string]string
		nproc int
		names []string
		slots []int
		err   string
	}{
		{name: "nothing else: one per node", env: alloc(nil), names: []string{"node01", "node02", "gpu-7"}, slots: []int{1, 1, 1}},
		{name: "tasks per node, compressed", env: alloc(map[string]string{SlurmTasksPerNode: "2(x2),1"}), slots: []int{2, 2, 1}},
		{name: "ntasks per node", env: alloc(map[string]string{SlurmNTasksPer: "3"}), slots: []int{3, 3, 3}},
		{name: "gpus win over tasks", env: alloc(map[string]string{SlurmGPUsOnNode: "4", SlurmTasksPerNode: "1(x3)"}), slots: []int{4, 4, 4}},
		{name: "zero gpus: tasks", env: alloc(map[string]string{SlurmGPUsOnNode: "0", SlurmTasksPerNode: "1(x3)"}), slots: []int{1, 1, 1}},
		{name: "nproc wins", env: alloc(map[string]string{SlurmGPUsOnNode: "4", SlurmTasksPerNode: "1(x3)"}), nproc: 2, slots: []int{2, 2, 2}},
		{name: "old nodelist name", env: map[string]string{SlurmJobID: "7", SlurmNodelist: "a,b"}, names: []string{"a", "b"}, slots: []int{1, 1}},
		{name: "outside", env: map[string]string{SlurmJobNodelist: "a"}, err: "not inside a Slurm allocation"},
		{name: "nnodes mismatch", env: alloc(map[string]string{SlurmNNodes: "4"}), err: `SLURM_NNODES="4" but the node list has 3 nodes`},
		{name: "tasks for other nodes", env: alloc(map[string]string{SlurmTasksPerNode: "2(x2)"}), err: "SLURM_TASKS_PER_NODE"},
		{name: "bad gpus", env: alloc(map[string]string{SlurmGPUsOnNode: "99999"}), err: "SLURM_GPUS_ON_NODE"},
		{name: "bad list", env: map[string]string{SlurmJobID: "1", SlurmJobNodelist: "n[2-1]"}, err: "runs backwards"},
		{name: "duplicate", env: map[string]string{SlurmJobID: "1", SlurmJobNodelist: "n[1-2],N1"}, err: `host "N1" is listed twice`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hosts, err := SlurmHosts(envOf(tc.env), tc.nproc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			var slots []int
			for _, h := range hosts {
				names = append(names, h.Name)
				slots = append(slots, h.Slots)
			}
			if tc.names != nil && !slices.Equal(names, tc.names) {
				t.Errorf("names = %q, want %q", names, tc.names)
			}
			if !slices.Equal(slots, tc.slots) {
				t.Errorf("slots = %v, want %v", slots, tc.slots)
			}
		})
	}
}

func TestSlurmHostsOutside(t *testing.T) {
	if _, err := SlurmHosts(envOf(nil), 0); !errors.Is(err, ErrNotInSlurm) {
		t.Fatalf("err = %v, want ErrNotInSlurm", err)
	}
	if InSlurm(envOf(map[string]string{SlurmJobID: "1"})) {
		t.Fatal("a job id without a node list counts as an allocation")
	}
}

// TestListHosts: --hosts takes a hostlist, and a Select over it works as
// over a hostfile's hosts.
func TestListHosts(t *testing.T) {
	hosts, err := ListHosts("node[01-02]", 2, "--hosts")
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := Select(hosts, Filter{Exclude: "node02:1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || !slices.Equal(nodes[0].SlotIDs, []int{0, 1}) || !slices.Equal(nodes[1].SlotIDs, []int{0}) {
		t.Fatalf("nodes = %+v", nodes)
	}
	for _, bad := range []struct {
		list  string
		slots int
		err   string
	}{
		{"a,a", 1, `host "a" is listed twice`},
		{"a", 0, "want 1 to 1024"},
		{"a[1-3", 1, "unclosed"},
		{"n[0-1024]", 1024, "more than 1048576 slots"},
	} {
		if _, err := ListHosts(bad.list, bad.slots, "--hosts"); err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("ListHosts(%q, %d) err = %v, want %q", bad.list, bad.slots, err, bad.err)
		}
	}
}

// TestReadHosts: --hostfile slurm is the allocation's nodes for every
// command that takes a hostfile; outside an allocation it is a usage
// error naming --hostfile slurm; any other name is a hostfile.
func TestReadHosts(t *testing.T) {
	alloc := map[string]string{SlurmJobID: "7", SlurmJobNodelist: "gpu[01-02]", SlurmGPUsOnNode: "8"}
	hosts, err := ReadHosts(t.Context(), Slurm, func(k string) string { return alloc[k] })
	if err != nil || len(hosts) != 2 || hosts[0].Name != "gpu01" || hosts[1].Name != "gpu02" || hosts[0].Slots != 8 || hosts[1].Slots != 8 {
		t.Fatalf("ReadHosts(slurm) in an allocation = %+v, %v; want gpu01 and gpu02 with 8 slots", hosts, err)
	}
	_, err = ReadHosts(t.Context(), Slurm, func(string) string { return "" })
	var ue *usage.Error
	if !errors.As(err, &ue) || !errors.Is(err, ErrNotInSlurm) || !strings.HasPrefix(err.Error(), "--hostfile slurm: ") {
		t.Fatalf("ReadHosts(slurm) outside an allocation: %v; want a usage error naming --hostfile slurm", err)
	}
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte("a slots=2\nb slots=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hosts, err = ReadHosts(t.Context(), path, func(k string) string { return alloc[k] })
	if err != nil || len(hosts) != 2 || hosts[0].Name != "a" || hosts[0].Slots != 2 {
		t.Fatalf("ReadHosts(%s) = %+v, %v; want the file's hosts, not the allocation's", path, hosts, err)
	}
}

package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// fakeAgents replaces the round in which remote hosts' agents report
// themselves with facts (by host name), or fails it with err; asked
// records the hosts each round asked.
func fakeAgents(t *testing.T, facts map[string]hostinfo.Host, err error) *[][]string {
	t.Helper()
	var asked [][]string
	old := detectNodes
	detectNodes = func(_ context.Context, _ *Request, nodes []hostfiles.Node) ([]hostinfo.Host, error) {
		var names []string
		var out []hostinfo.Host
		for _, n := range nodes {
			names = append(names, n.Name)
			out = append(out, facts[n.Name])
		}
		asked = append(asked, names)
		return out, err
	}
	t.Cleanup(func() { detectNodes = old })
	return &asked
}

func writeHostfile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hostfile")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// gpuFacts is a host with n GPUs.
func gpuFacts(n int) hostinfo.Host {
	h := pcieHost()
	h.GPUs = nil
	for i := range n {
		h.GPUs = append(h.GPUs, hostinfo.GPU{Index: i, Name: "NVIDIA L40S", NUMANode: -1})
	}
	return h
}

// TestNprocRemoteHosts: under --nproc-per-node gpu|auto, a remote host
// written without slots= gets as many ranks as its agent's report says
// (GPUs; under auto, else the CPUs its cgroup leaves), asked once per
// job, before any rank is numbered; ranks follow the hostfile's order.
func TestNprocRemoteHosts(t *testing.T) {
	cpus := cpuHost(8)
	cpus.Cgroup.CPUSet = []int{0, 1, 2, 3, 4, 5}
	asked := fakeAgents(t, map[string]hostinfo.Host{"gpu-a": gpuFacts(8), "gpu-b": gpuFacts(4), "cpu-c": cpus}, nil)
	hf := writeHostfile(t, "gpu-a\nlocalhost slots=2\ngpu-b max_slots=4\ncpu-c\n")
	r := &Request{Hostfile: hf, NprocFrom: NprocAuto, NprocPerNode: 1, Getenv: func(string) string { return "" }}
	nodes, fromFile, err := r.Nodes(t.Context(), 1)
	if err != nil || !fromFile {
		t.Fatalf("Nodes: %v (from the file: %v)", err, fromFile)
	}
	var got []string
	for _, n := range nodes {
		got = append(got, n.Name+":"+FormatCPUList(n.SlotIDs))
	}
	if want := []string{"gpu-a:0-7", "localhost:0-1", "gpu-b:0-3", "cpu-c:0-5"}; !slices.Equal(got, want) {
		t.Errorf("nodes %v, want %v", got, want)
	}
	job, err := r.Resolve(t.Context(), Workload{Command: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if job.WorldSize != 20 || job.Ranks[8].Host != "localhost" || job.Ranks[8].Rank != 8 || job.Ranks[10].Host != "gpu-b" || job.Ranks[19].LocalRank != 5 {
		t.Errorf("world %d, ranks %+v: want 20 ranks numbered in hostfile order", job.WorldSize, job.Ranks)
	}
	if want := [][]string{{"gpu-a", "gpu-b", "cpu-c"}}; !slices.EqualFunc(*asked, want, slices.Equal) {
		t.Errorf("agents asked %v, want %v: once for the job, the remote hosts without slots= only", *asked, want)
	}
}

// TestNprocRemoteRefusals: what --nproc-per-node cannot count on a remote
// host is refused, naming the host; the hostfile stays strict otherwise.
func TestNprocRemoteRefusals(t *testing.T) {
	fakeAgents(t, map[string]hostinfo.Host{"a": gpuFacts(8), "b": cpuHost(4)}, nil)
	run := func(text, from string, f hostfiles.Filter) error {
		r := &Request{Hostfile: writeHostfile(t, text), NprocFrom: from, NprocPerNode: 1, Filter: f}
		_, _, err := r.Nodes(t.Context(), 1)
		return err
	}
	var ue *usage.Error
	if err := run("a max_slots=4\n", NprocGPU, hostfiles.Filter{}); err == nil || !strings.Contains(err.Error(), `"a" has 8 slots by --nproc-per-node gpu, more than its max_slots=4`) || !strings.Contains(err.Error(), ":1") {
		t.Errorf("max_slots exceeded: %v", err)
	}
	if err := run("b\n", NprocGPU, hostfiles.Filter{}); !errors.As(err, &ue) || !strings.Contains(err.Error(), "host b: --nproc-per-node gpu: the host has no GPUs") {
		t.Errorf("gpu on a CPU host: %v, want a usage error naming it", err)
	}
	if err := run("a\nb slots=1\n", NprocGPU, hostfiles.Filter{Exclude: "b"}); !errors.As(err, &ue) || !strings.Contains(err.Error(), "a has no slots=") {
		t.Errorf("--exclude: %v, want a usage error naming a", err)
	}
	if err := run("a\n", "", hostfiles.Filter{}); err == nil || !strings.Contains(err.Error(), "missing slot count") {
		t.Errorf("no --nproc-per-node: %v, want the hostfile's error", err)
	}
	asked := fakeAgents(t, map[string]hostinfo.Host{"a": gpuFacts(2), "b": gpuFacts(2)}, nil)
	if err := run("a\nb\n", NprocGPU, hostfiles.Filter{NumNodes: 1, NumSlots: 2}); err != nil || len(*asked) != 1 || !slices.Equal((*asked)[0], []string{"a"}) {
		t.Errorf("--num-nodes 1 --num-gpus 2: %v, asked %v: want only a asked", err, *asked)
	}
	fakeAgents(t, nil, errors.New("dial b: connection refused"))
	if err := run("a\nb\n", NprocAuto, hostfiles.Filter{}); err == nil || !strings.Contains(err.Error(), "--nproc-per-node auto: count the slots of a, b: dial b: connection refused") {
		t.Errorf("unreachable: %v", err)
	}
}

package launch

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// TestJobBindEnv: with a binding the launcher leaves OMP_NUM_THREADS to
// the agent (the rank's cores, not torchrun's 1), and under --bind gpu
// the hostfile's CUDA_VISIBLE_DEVICES (every slot) too, which the agent
// narrows; the assignment carries the mode and each rank's slot.
func TestJobBindEnv(t *testing.T) {
	tests := []struct {
		bind         BindMode
		omp, visible string
		wantAssigned string
	}{
		{"", "1", "1,3", ""},
		{BindNone, "1", "1,3", "none"},
		{BindCore, "", "1,3", "core"},
		{BindGPU, "", "", "gpu"},
	}
	for _, tt := range tests {
		t.Run(string(tt.bind), func(t *testing.T) {
			p, err := NewJob(JobOptions{Nodes: twoNodes(), FromHostfile: true, Command: []string{"x"}, Getenv: noEnv, Bind: tt.bind})
			if err != nil {
				t.Fatal(err)
			}
			env := p.Ranks[1].Env
			if env["OMP_NUM_THREADS"] != tt.omp || env["CUDA_VISIBLE_DEVICES"] != tt.visible {
				t.Errorf("OMP_NUM_THREADS=%q CUDA_VISIBLE_DEVICES=%q, want %q and %q", env["OMP_NUM_THREADS"], env["CUDA_VISIBLE_DEVICES"], tt.omp, tt.visible)
			}
			asg := p.Assignment(0, 0)
			if asg.Bind != tt.wantAssigned {
				t.Errorf("assignment's bind %q, want %q", asg.Bind, tt.wantAssigned)
			}
			if got := []int{asg.Ranks[0].Slot, asg.Ranks[1].Slot}; !slices.Equal(got, []int{1, 3}) {
				t.Errorf("assigned slots %v, want the hostfile's [1 3]", got)
			}
		})
	}
}

// TestJobShowsLocalBinding: the job plans the binding of the ranks on this
// machine (--dry-run prints it), without the variables the user set, and
// none for a remote host, whose agent plans its own.
func TestJobShowsLocalBinding(t *testing.T) {
	// A 4-GPU box whose node 1, where GPUs 2 and 3 are, has the CPUs this
	// process may use, so the plan is what the agent would apply here.
	own := processAffinity()
	local := pcieHost()
	local.NUMA = []hostinfo.NUMANode{{ID: 0, CPUs: []int{1000, 1001}}, {ID: 1, CPUs: own}}
	local.CPU.Online = append(slices.Clone(own), 1000, 1001)
	nodes := []hostfiles.Node{
		{Host: hostfiles.Host{Name: "localhost", Slots: 4}, SlotIDs: []int{2, 3}},
		{Host: hostfiles.Host{Name: "worker-1", Slots: 2}, SlotIDs: []int{0, 1}},
	}
	getenv := func(k string) string {
		if k == "GLOO_SOCKET_IFNAME" {
			return "eth9" // in the launcher's environment: the user's
		}
		return ""
	}
	p, err := NewJob(JobOptions{Nodes: nodes, FromHostfile: true, Command: []string{"x"}, Getenv: getenv, Bind: BindCore,
		Env: []string{"NCCL_SOCKET_IFNAME=eth9"}, LocalHost: func() *hostinfo.Host { return &local }})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Ranks {
		if r.Node == 1 {
			if r.Bind != nil {
				t.Errorf("rank %d on a remote host has a binding %+v planned here", r.Rank, r.Bind)
			}
			continue
		}
		b := r.Bind
		if b == nil {
			t.Fatalf("rank %d on this machine has no binding", r.Rank)
		}
		if b.Mode != BindCore || b.GPU != r.Slot || b.NUMANode != 1 || len(b.CPUs) == 0 {
			t.Errorf("rank %d: binding %+v, want core on GPU %d's NUMA node 1", r.Rank, b, r.Slot)
		}
		for _, c := range b.CPUs {
			if !slices.Contains(own, c) {
				t.Errorf("rank %d: CPU %d is not one this process may use (%v)", r.Rank, c, own)
			}
		}
		if _, ok := b.Env["NCCL_SOCKET_IFNAME"]; ok {
			t.Errorf("rank %d: binding shows NCCL_SOCKET_IFNAME, which --env set", r.Rank)
		}
		if _, ok := b.Env["GLOO_SOCKET_IFNAME"]; ok {
			t.Errorf("rank %d: binding shows GLOO_SOCKET_IFNAME, which the launcher's environment set", r.Rank)
		}
		if b.Env["NCCL_IB_HCA"] != "=mlx5_1:1" {
			t.Errorf("rank %d: NCCL_IB_HCA %q, want the NIC of node 1", r.Rank, b.Env["NCCL_IB_HCA"])
		}
	}
}

// TestJobRefusesLocalBinding: a binding this machine cannot give is a
// usage error before anything starts, naming the host and the way out.
func TestJobRefusesLocalBinding(t *testing.T) {
	one := cpuHost(1)
	_, err := NewJob(JobOptions{Nodes: localNodes(2), Command: []string{"x"}, Getenv: noEnv, Bind: BindCore,
		LocalHost: func() *hostinfo.Host { return &one }})
	var ue *usage.Error
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "host localhost") || !strings.Contains(err.Error(), "--bind numa") {
		t.Fatalf("NewJob = %v, want a usage error naming localhost and --bind numa", err)
	}
}

// TestWithDefaults: a binding's variables never replace one already set.
func TestWithDefaults(t *testing.T) {
	got := withDefaults([]string{"OMP_NUM_THREADS=7", "PATH=/bin"}, map[string]string{"OMP_NUM_THREADS": "2", "GTRAIN_CPUS": "2"})
	want := []string{"OMP_NUM_THREADS=7", "PATH=/bin", "GTRAIN_CPUS=2"}
	if !slices.Equal(got, want) {
		t.Errorf("withDefaults = %q, want %q", got, want)
	}
}

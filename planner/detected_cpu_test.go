package planner

import (
	"math"
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// cpuHost is a detected CPU host: threads CPUs, memGiB of memory, the
// cgroup quota q CPUs (0: none).
func cpuHost(name string, threads int, memGiB int64, q float64) hostinfo.Host {
	h := hostinfo.Host{Name: name, CPU: hostinfo.CPU{Threads: threads},
		NUMA: []hostinfo.NUMANode{{ID: 0, MemoryBytes: memGiB << 30}}}
	h.Cgroup.CPUs = q
	return h
}

// TestCPUTopologyWith: the planner's CPU ranks run at the speed it is
// given (measured on the engine's kernels) rather than the default's, and
// on the CPUs --bind gives each rank when it says so, within the host's
// quota.
func TestCPUTopologyWith(t *testing.T) {
	o := DefaultOptions()
	measured := CPUSpeed{GEMMFLOPSPerCore: 100e9, KernelBytesPerSecPerCore: 5e9}
	two := []hostinfo.Host{cpuHost("a", 16, 64, 0), cpuHost("b", 16, 64, 0)}
	quota := []hostinfo.Host{cpuHost("a", 16, 64, 4), cpuHost("b", 16, 64, 4)}
	for _, tt := range []struct {
		name  string
		hosts []hostinfo.Host
		ranks []int
		f     CPUFigures
		cores float64 // per rank
		gemm  float64 // per core
	}{
		{"defaults: cores ÷ ranks", two, []int{2, 2}, CPUFigures{}, 8, DefaultCPUSpeed.GEMMFLOPSPerCore},
		{"measured speed", two, []int{2, 2}, CPUFigures{Speed: measured}, 8, 100e9},
		{"bound: the rank's mask", two, []int{3, 3}, CPUFigures{Speed: measured, RankCPUs: 4}, 4, 100e9},
		{"bound, within the quota", quota, []int{2, 2}, CPUFigures{Speed: measured, RankCPUs: 8}, 2, 100e9},
		{"a mask larger than the host", two, []int{1, 1}, CPUFigures{RankCPUs: 64}, 16, DefaultCPUSpeed.GEMMFLOPSPerCore},
	} {
		t.Run(tt.name, func(t *testing.T) {
			top, _, err := CPUTopologyWith(tt.hosts, tt.ranks, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.cores * tt.gemm / o.Efficiency
			if math.Abs(top.GPU.PeakFLOPS-want) > 1e-6*want {
				t.Errorf("a rank's peak %.4g FLOP/s, want %.4g (%v cores at %.3g each)", top.GPU.PeakFLOPS, want, tt.cores, tt.gemm)
			}
		})
	}
	def, _, err := CPUTopologyOf(two, []int{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	with, _, _ := CPUTopologyWith(two, []int{2, 2}, CPUFigures{Speed: DefaultCPUSpeed})
	if def != with {
		t.Errorf("CPUTopologyOf %+v, CPUTopologyWith the defaults %+v: want the same", def, with)
	}
}

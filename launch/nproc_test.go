package launch

import (
	"errors"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// TestCountSlots: --nproc-per-node gpu and auto count as torchrun does,
// auto's CPUs within those this process may use.
func TestCountSlots(t *testing.T) {
	dgx, pcie := dgxHost(), pcieHost()
	own := processAffinity()
	if len(own) == 0 {
		t.Fatal("no CPU affinity")
	}
	mine := hostinfo.Host{Name: "here", CPU: hostinfo.CPU{Online: append(span(0, own[len(own)-1]), 5000)}}
	for _, tt := range []struct {
		name string
		host hostinfo.Host
		from string
		want int
	}{
		{"gpu on a DGX", dgx, NprocGPU, 8},
		{"auto on a GPU box is its GPUs", pcie, NprocAuto, 4},
		{"auto without GPUs: the CPUs this process may use", mine, NprocAuto, len(own)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, err := CountSlots(&tt.host, tt.from)
			if err != nil || n != tt.want {
				t.Errorf("CountSlots = %d, %v; want %d", n, err, tt.want)
			}
		})
	}
	cpu := cpuHost(4)
	_, err := CountSlots(&cpu, NprocGPU)
	var ue *usage.Error
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no GPUs (NVML: libnvidia-ml.so.1 not found)") {
		t.Errorf("gpu without GPUs: %v, want a usage error saying why", err)
	}
}

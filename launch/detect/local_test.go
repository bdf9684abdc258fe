package detect

import (
	"context"
	"encoding/json"
	"testing"
)

// TestLocal runs detection on this machine: whatever it has, detection
// returns without a panic, sees its online CPUs and at least one NUMA node,
// and either lists GPUs or says why there are none.
func TestLocal(t *testing.T) {
	h := Local(context.Background())
	if h.CPU.Threads == 0 || len(h.CPU.Online) != h.CPU.Threads {
		t.Errorf("CPU = %+v: want the online CPUs", h.CPU)
	}
	if len(h.NUMA) == 0 {
		t.Error("no NUMA node: want at least node 0")
	}
	if len(h.GPUs) == 0 && h.GPUError == "" {
		t.Error("no GPUs and no GPUError: want the reason")
	}
	out, _ := json.MarshalIndent(h, "", "  ")
	t.Logf("%s", out)
}

package detect

import (
	"fmt"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// problems are what a user should fix or know about h's GPUs, beyond those
// the scan reported (a GPU NVML could not read): MIG on (a MIG GPU is not
// one CUDA device for training), and a GPU with fewer active NVLinks than
// the best of its host (a link down, or a GPU on PCIe beside NVLinked
// ones), which makes collectives run at the slowest link's pace.
func problems(h hostinfo.Host) []string {
	var out []string
	most := 0
	for _, g := range h.GPUs {
		most = max(most, activeLinks(g))
	}
	for _, g := range h.GPUs {
		if g.MIG {
			out = append(out, fmt.Sprintf("GPU %d (%s): MIG is on: training sees MIG instances, not the GPU; turn it off with nvidia-smi -i %d -mig 0", g.Index, g.PCIBusID, g.Index))
		}
		if n := activeLinks(g); n < most {
			out = append(out, fmt.Sprintf("GPU %d (%s): %d active NVLinks where another GPU has %d: a link is down or missing (nvidia-smi nvlink -s -i %d)", g.Index, g.PCIBusID, n, most, g.Index))
		}
	}
	return out
}

// activeLinks counts g's NVLinks that are up.
func activeLinks(g hostinfo.GPU) int {
	n := 0
	for _, l := range g.NVLinks {
		if l.Active {
			n++
		}
	}
	return n
}

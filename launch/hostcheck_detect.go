package launch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/launch/detect"
)

// gpus detects this machine's hardware (launch/detect); on another host
// it counts the GPUs with nvidia-smi -L (MIG devices, listed indented
// under their GPU, are not counted) until remoteDetect, which needs gtrain
// there, replaces the count with the host's facts. Either checks the
// hostfile's slots, which are device ids, exist.
func (hc *HostCheck) gpus(ctx context.Context, p *hostProbe) error {
	if p.Local {
		h := detect.Local(ctx)
		return p.judgeFacts(&h)
	}
	script := `command -v nvidia-smi >/dev/null 2>&1 || { echo absent; exit 0; }; echo present; ` +
		hc.withTimeout("nvidia-smi -L 2>&1")
	res, err := hc.bounded(ctx, p.sh, script)
	out := strings.TrimSpace(res.stdout)
	switch {
	case err != nil:
	case out == "absent":
		p.GPU = passed("no nvidia-smi")
		return nil
	case res.code != 0:
		err = fmt.Errorf("nvidia-smi -L: exit status %d: %s", res.code, firstLine(strings.TrimPrefix(out, "present")))
	}
	if err != nil {
		p.GPU = failed(shortReason(err))
		return fmt.Errorf("check: GPUs of %s: %w", p.Host, err)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "GPU ") {
			p.GPUs++
		}
	}
	for _, slot := range p.host.Slots {
		if slot >= p.GPUs {
			p.GPU = failed(fmt.Sprintf("slot %d but %d GPUs", slot, p.GPUs))
			return fmt.Errorf("check: GPUs of %s: the hostfile gives slot %d (a device id) but nvidia-smi lists %d GPU(s)", p.Host, slot, p.GPUs)
		}
	}
	p.GPU = passed("")
	return nil
}

// detectLimit bounds what `gtrain hosts detect` may print: a host's facts
// are a few KiB (a DGX's, with its matrix, about 40).
const detectLimit = 1 << 20

// remoteDetect runs `gtrain hosts detect` with the host's gtrain (bin) and
// judges the GPUs by its facts. A gtrain too old to have the command
// prints no JSON object on stdout: nvidia-smi's count then stands.
func (hc *HostCheck) remoteDetect(ctx context.Context, p *hostProbe, bin string) error {
	script := hc.withTimeout(shellQuote(bin)+" hosts detect 2>/dev/null") + fmt.Sprintf(" | head -c %d", detectLimit+1)
	res, err := hc.bounded(ctx, p.sh, script)
	out := strings.TrimSpace(res.stdout)
	switch {
	case err != nil:
	case !strings.HasPrefix(out, "{"):
		return nil // nothing, or not the facts (a gtrain without the command)
	case len(out) > detectLimit:
		err = fmt.Errorf("%s hosts detect: more than %d bytes of output", bin, detectLimit)
	}
	var h hostinfo.Host
	if err == nil {
		if jerr := json.Unmarshal([]byte(out), &h); jerr != nil {
			err = fmt.Errorf("%s hosts detect: %v", bin, jerr)
		}
	}
	if err != nil {
		p.GPU = failed(shortReason(err))
		return fmt.Errorf("check: hardware of %s: %w", p.Host, err)
	}
	p.GPUs = 0
	return p.judgeFacts(&h)
}

// judgeFacts sets the GPU check from detected facts: the GPUs found, the
// hostfile's slots among them. A host without GPUs passes, with the
// reason as a note (CPU hosts run the built-in engine; their slots are
// rank counts, not device ids).
func (p *hostProbe) judgeFacts(h *hostinfo.Host) error {
	p.Facts, p.GPUs = h, len(h.GPUs)
	if p.GPUs == 0 {
		p.GPU = passed(noGPUNote(h.GPUError))
		return nil
	}
	for _, slot := range p.host.Slots {
		if slot >= p.GPUs {
			p.GPU = failed(fmt.Sprintf("slot %d but %d GPUs", slot, p.GPUs))
			return fmt.Errorf("check: GPUs of %s: the hostfile gives slot %d (a device id) but detection finds %d GPU(s)", p.Host, slot, p.GPUs)
		}
	}
	p.GPU = passed("")
	if len(h.Problems) > 0 {
		p.GPU = passed(fmt.Sprintf("%d problems", len(h.Problems)))
	}
	return nil
}

// noGPUNote is why a host has no GPUs, in a few words.
func noGPUNote(reason string) string {
	switch {
	case strings.Contains(reason, "no NVIDIA driver"):
		return "no driver"
	case strings.Contains(reason, "without cgo"):
		return "no NVML in this build"
	case reason == "":
		return ""
	}
	return "NVML failed"
}

// Detected returns each host's facts, in order, for `gtrain hosts
// topology`; a host that could not be checked or whose facts could not be
// read is an error naming it (all of them, "; "-separated).
func Detected(reports []HostReport) ([]hostinfo.Host, error) {
	facts := make([]hostinfo.Host, 0, len(reports))
	var missing []string
	for _, r := range reports {
		if r.Facts == nil {
			why := r.Error
			if why == "" {
				why = "its gtrain has no `hosts detect` (run gtrain run there once, or pass --remote-gtrain)"
			}
			missing = append(missing, fmt.Sprintf("%s: %s", r.Host, why))
			continue
		}
		h := *r.Facts
		h.Name = r.Host // the hostfile's name, which the user knows it by
		facts = append(facts, h)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("detect: no hardware facts from %d of %d hosts: %s", len(missing), len(reports), strings.Join(missing, "; "))
	}
	return facts, nil
}

// UnequalHosts says how the hosts' GPUs differ (count, model, memory,
// active NVLinks), one line per host unlike the first: the planner plans
// for identical nodes, and a slower host paces every collective.
func UnequalHosts(reports []HostReport) []string {
	var out []string
	var first *HostReport
	for i := range reports {
		r := &reports[i]
		if r.Facts == nil {
			continue
		}
		if first == nil {
			first = r
			continue
		}
		if a, b := gpuShape(*first.Facts), gpuShape(*r.Facts); a != b {
			out = append(out, fmt.Sprintf("hosts differ: %s has %s, %s %s", first.Host, a, r.Host, b))
		}
	}
	return out
}

// gpuShape is a host's GPUs in a few words: "8 × NVIDIA H100 80GB HBM3
// (79.6 GiB, 18 NVLinks)", the fewest NVLinks of a GPU.
func gpuShape(h hostinfo.Host) string {
	if len(h.GPUs) == 0 {
		return "no GPUs"
	}
	links := -1
	names := map[string]bool{}
	var mem int64 = -1
	for _, g := range h.GPUs {
		n := 0
		for _, l := range g.NVLinks {
			if l.Active {
				n++
			}
		}
		if links < 0 || n < links {
			links = n
		}
		if mem < 0 || g.MemoryBytes < mem {
			mem = g.MemoryBytes
		}
		names[g.Name] = true
	}
	name := h.GPUs[0].Name
	if len(names) > 1 {
		name = "mixed GPUs"
	}
	return fmt.Sprintf("%d × %s (%.1f GiB, %d NVLinks)", len(h.GPUs), name, float64(mem)/(1<<30), links)
}

package detect

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxCPU bounds the CPU and node ids a list may name: Linux's NR_CPUS tops
// out at 8192 today, so a larger id is a corrupt or hostile file, and
// expanding "0-4294967295" would exhaust memory.
const MaxCPU = 1 << 16

// ParseList reads a Linux CPU or node list as sysfs and cgroups write them
// ("0-3,8-11", "0", "" for none; a range may carry a stride, "0-15:2"
// taking every second id, as cpuset(7) documents). The ids come back in
// the order given, each at most MaxCPU; a list naming more than MaxCPU ids
// in all is refused.
func ParseList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return []int{}, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, step, err := parseRange(part)
		if err != nil {
			return nil, fmt.Errorf("detect: list %q: %w", clip(s), err)
		}
		if len(out)+(hi-lo)/step+1 > MaxCPU {
			return nil, fmt.Errorf("detect: list %q: more than %d ids", clip(s), MaxCPU)
		}
		for id := lo; id <= hi; id += step {
			out = append(out, id)
		}
	}
	return out, nil
}

// parseRange reads "N", "N-M" or "N-M:S".
func parseRange(part string) (lo, hi, step int, err error) {
	rng, stride, hasStride := strings.Cut(strings.TrimSpace(part), ":")
	a, b, isRange := strings.Cut(rng, "-")
	if lo, err = parseID(a); err != nil {
		return 0, 0, 0, err
	}
	hi, step = lo, 1
	if isRange {
		if hi, err = parseID(b); err != nil {
			return 0, 0, 0, err
		}
	}
	if hasStride {
		if step, err = strconv.Atoi(stride); err != nil || step < 1 || step > MaxCPU {
			return 0, 0, 0, fmt.Errorf("stride %q: want 1-%d", stride, MaxCPU)
		}
	}
	if hi < lo {
		return 0, 0, 0, fmt.Errorf("range %q runs backwards", part)
	}
	return lo, hi, step, nil
}

// parseID reads one id, 0 to MaxCPU.
func parseID(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > MaxCPU {
		return 0, fmt.Errorf("id %q: want 0-%d", s, MaxCPU)
	}
	return n, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

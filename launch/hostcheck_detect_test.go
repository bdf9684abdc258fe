package launch

import (
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// TestUnequalHosts: hosts whose GPUs differ in count, model or NVLinks are
// named against the first; equal ones and hosts without facts are not.
func TestUnequalHosts(t *testing.T) {
	dgx := func(links int) *hostinfo.Host {
		h := &hostinfo.Host{}
		for i := range 8 {
			g := hostinfo.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30}
			for l := range 18 {
				g.NVLinks = append(g.NVLinks, hostinfo.NVLink{Link: l, Active: l < links || i > 0, Version: 4, ToSwitch: true})
			}
			h.GPUs = append(h.GPUs, g)
		}
		return h
	}
	box := &hostinfo.Host{GPUs: []hostinfo.GPU{{Name: "NVIDIA L40S", MemoryBytes: 45 << 30}}}
	reports := []HostReport{{Host: "a", Facts: dgx(18)}, {Host: "b", Facts: dgx(18)}, {Host: "c"}, {Host: "d", Facts: dgx(16)}, {Host: "e", Facts: box}}
	got := UnequalHosts(reports)
	want := []string{
		"hosts differ: a has 8 × NVIDIA H100 80GB HBM3 (80.0 GiB, 18 NVLinks), d 8 × NVIDIA H100 80GB HBM3 (80.0 GiB, 16 NVLinks)",
		"hosts differ: a has 8 × NVIDIA H100 80GB HBM3 (80.0 GiB, 18 NVLinks), e 1 × NVIDIA L40S (45.0 GiB, 0 NVLinks)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("UnequalHosts:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	if _, err := Detected(reports); err == nil || !strings.Contains(err.Error(), "1 of 5 hosts: c: its gtrain has no `hosts detect`") {
		t.Errorf("Detected with host c lacking facts: %v", err)
	}
	hosts, err := Detected([]HostReport{{Host: "worker-0", Facts: box}})
	if err != nil || len(hosts) != 1 || hosts[0].Name != "worker-0" {
		t.Errorf("Detected: %+v, %v: want worker-0's facts under its hostfile name", hosts, err)
	}
}

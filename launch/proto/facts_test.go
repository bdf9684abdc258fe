package proto

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// TestJoinedCarriesHost: the joined event carries the detected host
// through a line and back.
func TestJoinedCarriesHost(t *testing.T) {
	h := &hostinfo.Host{Name: "n0", GPUs: []hostinfo.GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3", NUMANode: 1, CPUs: []int{4, 5}}},
		NUMA: []hostinfo.NUMANode{{ID: 0, CPUs: []int{0, 1, 2, 3}}, {ID: 1, CPUs: []int{4, 5, 6, 7}}},
		NICs: []hostinfo.NIC{{Name: "ib0", Kind: "ib", Device: "mlx5_0", Port: 1, GbitPerS: 400, Up: true, NUMANode: 1}}}
	var buf bytes.Buffer
	if err := NewEncoder(&buf).Encode(Event{V: Version, Type: EventJoined, Rank: -1, Facts: &HostFacts{Hostname: "n0", Host: h}}); err != nil {
		t.Fatal(err)
	}
	var ev Event
	if err := NewDecoder(&buf).Decode(&ev); err != nil {
		t.Fatal(err)
	}
	if ev.Facts == nil || ev.Facts.Host == nil {
		t.Fatalf("joined event lost its host: %+v", ev.Facts)
	}
	got := ev.Facts.Host
	if len(got.GPUs) != 1 || got.GPUs[0].NUMANode != 1 || len(got.NUMA) != 2 || got.NICs[0].Device != "mlx5_0" {
		t.Errorf("host came back as %+v", got)
	}
	if err := ev.Facts.Check(); err != nil {
		t.Errorf("Check: %v", err)
	}
}

// TestHostFactsCheck refuses facts no real host has, naming the field.
func TestHostFactsCheck(t *testing.T) {
	many := make([]int, MaxFactCPUs+1)
	tests := []struct {
		name string
		host hostinfo.Host
		want string
	}{
		{"too many GPUs", hostinfo.Host{GPUs: make([]hostinfo.GPU, MaxFactGPUs+1)}, "257 GPUs"},
		{"matrix larger than the GPUs", hostinfo.Host{Matrix: make([][]hostinfo.Link, 1)}, "GPU matrix rows"},
		{"too many NUMA nodes", hostinfo.Host{NUMA: make([]hostinfo.NUMANode, MaxFactNUMA+1)}, "NUMA nodes"},
		{"too many NICs", hostinfo.Host{NICs: make([]hostinfo.NIC, MaxFactNICs+1)}, "NICs"},
		{"a CPU list too long", hostinfo.Host{CPU: hostinfo.CPU{Online: many}}, "a list of 8193 CPUs"},
		{"a CPU number out of range", hostinfo.Host{NUMA: []hostinfo.NUMANode{{CPUs: []int{1 << 30}}}}, "CPU 1073741824"},
		{"a negative CPU", hostinfo.Host{Cgroup: hostinfo.Cgroup{CPUSet: []int{-1}}}, "CPU -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := (&HostFacts{Hostname: "n1", Host: &tt.host}).Check()
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "host n1") {
				t.Errorf("Check = %v, want an error naming host n1 and %q", err, tt.want)
			}
		})
	}
	if err := (&HostFacts{}).Check(); err != nil {
		t.Errorf("facts without a host: %v", err)
	}
}

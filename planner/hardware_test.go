package planner

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseLink(t *testing.T) {
	cases := []struct {
		in      string
		want    Link
		bytesPS float64
		err     string
	}{
		{in: "ib:4x200", want: Link{Kind: "ib", Count: 4, GbitPerS: 200}, bytesPS: 100e9},
		{in: "eth:100", want: Link{Kind: "eth", Count: 1, GbitPerS: 100}, bytesPS: 12.5e9},
		{in: "roce:8x400G", want: Link{Kind: "roce", Count: 8, GbitPerS: 400}, bytesPS: 400e9},
		{in: "nvswitch:300GB", want: Link{Kind: "nvswitch", Count: 1, GbitPerS: 2400}, bytesPS: 300e9},
		{in: "IB:2x12.5", want: Link{Kind: "ib", Count: 2, GbitPerS: 12.5}, bytesPS: 3.125e9},
		{in: "none", want: Link{Kind: "none"}},
		{in: "ib", err: `want kind:RATE`},
		{in: "carrier-pigeon:1", err: `want kind:RATE`},
		{in: "ib:0x200", err: `link count "0"`},
		{in: "ib:4x", err: `rate ""`},
		{in: "eth:-5", err: `rate "-5"`},
		{in: "eth:NaN", err: `rate "NaN"`},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseLink(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want || got.BytesPerSec() != c.bytesPS {
				t.Fatalf("got %+v (%g B/s), %v; want %+v (%g B/s)", got, got.BytesPerSec(), err, c.want, c.bytesPS)
			}
		})
	}
}

// FuzzParseLink: ParseLink never panics, and what it accepts prints back in
// a form it parses to the same link.
func FuzzParseLink(f *testing.F) {
	for _, s := range []string{"ib:4x200", "eth:100", "nvswitch:300GB", "none", "roce:8x400G", "x:1x", "ib:1e400"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLink(s)
		if err != nil {
			return
		}
		back, err := ParseLink(l.String())
		if err != nil || back.BytesPerSec() != l.BytesPerSec() || back.Kind != l.Kind {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, l, l.String(), back, err)
		}
	})
}

func TestLookupGPU(t *testing.T) {
	for in, want := range map[string]string{"a100": "A100-80GB", "A100-40GB": "A100-40GB", "h100-sxm": "H100",
		"h200": "H200", "V100": "V100-32GB", "mi300x": "MI300X", "A100_80GB": "A100-80GB"} {
		e, err := LookupGPU(in)
		if err != nil || e.GPU.Name != want {
			t.Errorf("%q: %q, %v; want %q", in, e.GPU.Name, err, want)
		}
	}
	if _, err := LookupGPU("tpu-v4"); err == nil || !strings.Contains(err.Error(), "A100-80GB") {
		t.Errorf("unknown GPU: %v, want an error listing the catalog", err)
	}
	// Data-sheet figures the tests and docs rely on.
	for name, peak := range map[string]float64{"A100-80GB": 312e12, "H100": 989e12, "H200": 989e12, "V100-32GB": 125e12} {
		if Catalog[name].GPU.PeakFLOPS != peak {
			t.Errorf("%s: peak %g, want %g", name, Catalog[name].GPU.PeakFLOPS, peak)
		}
	}
	for name, bw := range map[string]float64{"A100-80GB": 2039e9, "H100": 3350e9, "H200": 4800e9} {
		if Catalog[name].GPU.MemoryBytesPerSec != bw {
			t.Errorf("%s: memory bandwidth %g B/s, want %g", name, Catalog[name].GPU.MemoryBytesPerSec, bw)
		}
	}
	for name, e := range Catalog {
		if !(e.GPU.MemoryBytesPerSec > 0) {
			t.Errorf("%s: no memory bandwidth: its memory-bound kernels would go uncharged", name)
		}
	}
}

func TestParseTopology(t *testing.T) {
	top := Topology{Nodes: 2, GPUsPerNode: 8, GPU: Catalog["H100"].GPU, Intra: Catalog["H100"].Intra, Inter: Catalog["H100"].Inter}
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseTopology(b)
	if err != nil || got != top {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for in, want := range map[string]string{
		`{"nodes": 2, "gpus_per_node": 8, "gpu": {"name": "x", "memory_bytes": 1, "peak_flops": 1}, "intra": {"kind": "nvswitch", "gbit_per_s": 1}}`: "inter",
		`{"nodes": 1, "gpus_per_node": 8, "gpu": {"name": "x", "memory_bytes": 1, "peak_flops": 1}}`:                                                 "intra",
		`{"nodes": 1, "gpus_per_node": 1, "gpu": {"name": "x", "memory_bytes": 0, "peak_flops": 1}}`:                                                 "memory_bytes",
		`{"nodes": 1, "gpus_per_node": 1, "gpu": {"name": "x", "memory_bytes": 1, "peak_flops": 1, "memory_bytes_per_s": -1}}`:                       "memory_bytes_per_s -1",
		`{"nodes": 1, "gpus": 1}`: "unknown field",
		`{"nodes": 1} {}`:         "more than one",
		`[`:                       "unexpected EOF",
	} {
		if _, err := ParseTopology([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error containing %q", in, err, want)
		}
	}
}

// FuzzParseTopology: no input makes ParseTopology panic, and an accepted
// topology can be searched without panicking either.
func FuzzParseTopology(f *testing.F) {
	f.Add([]byte(`{"nodes": 2, "gpus_per_node": 8, "gpu": {"name": "A100", "memory_bytes": 85899345920, "peak_flops": 312e12}, "intra": {"kind": "nvswitch", "count": 12, "gbit_per_s": 200}, "inter": {"kind": "ib", "count": 8, "gbit_per_s": 200}}`))
	f.Add([]byte(`{"nodes": 1, "gpus_per_node": 1, "gpu": {"name": "cpu", "memory_bytes": 1, "peak_flops": 1e-300}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		top, err := ParseTopology(data)
		if err != nil || top.GPUs() > 4096 {
			return
		}
		pr := Problem{Model: Presets["gpt2"].Model, Topology: top, GlobalBatch: 64, Precision: FP16, Options: DefaultOptions()}
		if _, err := Search(pr, Space{}); err != nil && pr.Validate() == nil {
			t.Fatalf("valid problem, search error: %v", err)
		}
	})
}

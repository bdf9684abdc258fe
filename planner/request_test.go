package planner

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
)

func TestParseCount(t *testing.T) {
	for in, want := range map[string]float64{"175B": 175e9, "1.5e9": 1.5e9, "7b": 7e9, "1T": 1e12, "350M": 350e6, " 13B ": 13e9, "2k": 2e3} {
		if got, err := parseCount(in); err != nil || got != want {
			t.Errorf("%q: %g, %v; want %g", in, got, err, want)
		}
	}
	for _, in := range []string{"", "B", "-7B", "0", "NaN", "1e400", "seven"} {
		if _, err := parseCount(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// FuzzParseCount: parseCount never panics and accepts only positive finite
// counts.
func FuzzParseCount(f *testing.F) {
	for _, s := range []string{"175B", "1.5e9", "1T", "0x10", "-1", "inf"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseCount(s)
		if err == nil && !(v > 0 && !math.IsInf(v, 1)) {
			t.Fatalf("%q → %g accepted", s, v)
		}
	})
}

func TestCPUTopology(t *testing.T) {
	top := CPUTopology([]int{2, 2}, 16<<30, 8)
	if top.Nodes != 2 || top.GPUsPerNode != 2 || top.GPU.MemoryBytes != 8<<30 || top.GPU.PeakFLOPS != 4*DefaultCPUSpeed.GEMMFLOPSPerCore/DefaultOptions().Efficiency {
		t.Errorf("equal hosts: %+v", top)
	}
	// Unequal hosts: one rank per node (every rank pays the network), with
	// the memory of the fullest host's ranks.
	top = CPUTopology([]int{4, 2}, 16<<30, 8)
	if top.Nodes != 6 || top.GPUsPerNode != 1 || top.GPU.MemoryBytes != 4<<30 {
		t.Errorf("unequal hosts: %+v", top)
	}
	if err := top.Validate(); err != nil {
		t.Error(err)
	}
}

// request is a valid Request on --gpus 16 with gtrain plan's defaults.
func request() Request {
	return Request{Preset: "gpt2", Precision: "bf16", GPUs: 16, GPUsPerNode: 8, GPU: "A100-80GB", Options: DefaultOptions()}
}

// TestProblemFromPins: repeated pinned values are searched once, in order,
// and the caller's slices are left as given.
func TestProblemFromPins(t *testing.T) {
	r := request()
	r.Pins.TP, r.Pins.Zero, r.Recompute = []int{4, 1, 4, 2}, []int{1, 1}, []string{"full", "none", "full"}
	_, sp, err := ProblemFrom(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sp.TP, []int{1, 2, 4}) || !slices.Equal(sp.Zero, []int{1}) || sp.PP != nil ||
		!slices.Equal(sp.Recompute, []Recompute{RecomputeFull, RecomputeNone}) {
		t.Errorf("pins %+v", sp)
	}
	if !slices.Equal(r.Pins.TP, []int{4, 1, 4, 2}) {
		t.Errorf("the request's pins changed: %v", r.Pins.TP)
	}
	r.Pins.DP = make([]int, maxPinValues+1)
	for i := range r.Pins.DP {
		r.Pins.DP[i] = i + 1
	}
	if _, _, err := ProblemFrom(t.Context(), r); !isUsage(err) || !strings.Contains(err.Error(), "plan: --dp: 65 values: pin at most 64") {
		t.Errorf("65 dp values: %v", err)
	}
}

func isUsage(err error) bool {
	var u *usage.Error
	return errors.As(err, &u)
}

// TestProblemFromHostfile: a hostfile's hosts are nodes of their slots;
// unequal hosts are refused naming two of them, and the hostfile's own
// errors (a line it cannot parse) are returned as they are.
func TestProblemFromHostfile(t *testing.T) {
	dir := t.TempDir()
	write := func(text string) string {
		path := filepath.Join(dir, "hosts")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	r := request()
	r.GPUs, r.Hostfile = 0, write("n0 slots=4\nn1 slots=4\nn2 slots=4\n")
	pr, _, err := ProblemFrom(t.Context(), r)
	if err != nil || pr.Topology.Nodes != 3 || pr.Topology.GPUsPerNode != 4 || pr.Topology.GPU.Name != "A100-80GB" {
		t.Errorf("%+v, %v", pr.Topology, err)
	}
	write("n0 slots=4\nn1 slots=4\nn2 slots=2\n")
	if _, _, err := ProblemFrom(t.Context(), r); !isUsage(err) || !strings.Contains(err.Error(), "plan: --hostfile "+r.Hostfile+": n0 has 4 slots and n2 2") {
		t.Errorf("unequal hosts: %v", err)
	}
	write("n0 slots=x\n")
	var pe *hostfiles.ParseError
	if _, _, err := ProblemFrom(t.Context(), r); !errors.As(err, &pe) || pe.Line != 1 {
		t.Errorf("a bad line: %v, want the hostfile's *ParseError at line 1", err)
	}
}

// TestProblemFromTopologyFile: --topology reads the file; a changed
// per-GPU flag conflicts with it, a default one does not.
func TestProblemFromTopologyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "top.json")
	err := os.WriteFile(path, []byte(`{"nodes": 2, "gpus_per_node": 4, "gpu": {"name": "x", "memory_bytes": 85899345920, "peak_flops": 1e15},
		"intra": {"kind": "nvswitch", "gbit_per_s": 2400}, "inter": {"kind": "ib", "count": 4, "gbit_per_s": 400}}`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	r := request()
	r.GPUs, r.Topology = 0, path
	pr, _, err := ProblemFrom(t.Context(), r)
	if err != nil || pr.Topology.GPUs() != 8 || pr.Topology.GPU.Name != "x" {
		t.Fatalf("%+v, %v", pr.Topology, err)
	}
	r.Changed = func(flag string) bool { return flag == "intra" }
	if _, _, err := ProblemFrom(t.Context(), r); !isUsage(err) || !strings.Contains(err.Error(), "plan: --intra and --topology both describe the cluster") {
		t.Errorf("--intra with --topology: %v", err)
	}
	r.Changed, r.Topology = nil, filepath.Join(t.TempDir(), "none.json")
	if _, _, err := ProblemFrom(t.Context(), r); err == nil || !strings.HasPrefix(err.Error(), "plan: --topology: ") {
		t.Errorf("missing file: %v", err)
	}
}

// TestPlanStopsWithContext: Plan returns the context's cause when it is
// done, whether before the topology file is read or during the search.
func TestPlanStopsWithContext(t *testing.T) {
	cause := errors.New("interrupted")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	if _, _, err := Plan(ctx, request()); err != cause {
		t.Errorf("search: %v, want %v", err, cause)
	}
	r := request()
	r.GPUs, r.Topology = 0, "/nonexistent/top.json"
	if _, _, err := Plan(ctx, r); err != cause {
		t.Errorf("topology file: %v, want %v", err, cause)
	}
}

// TestGridCoords: Coords is Coord of every rank.
func TestGridCoords(t *testing.T) {
	g := Grid{TP: 2, PP: 3, DP: 2}
	cs := g.Coords()
	if len(cs) != g.World() {
		t.Fatalf("%d coords, want %d", len(cs), g.World())
	}
	for r, c := range cs {
		if c != g.Coord(r) {
			t.Errorf("rank %d: %+v, want %+v", r, c, g.Coord(r))
		}
	}
}

// TestGPUPeak: 16-bit runs at PeakFLOPS, fp32 at PeakFP32FLOPS, or half
// of PeakFLOPS where the GPU gives none.
func TestGPUPeak(t *testing.T) {
	a100 := Catalog["A100-80GB"].GPU
	noFP32 := GPU{PeakFLOPS: 100}
	for _, c := range []struct {
		g    GPU
		p    Precision
		want float64
	}{{a100, BF16, 312e12}, {a100, FP16, 312e12}, {a100, FP32, 156e12}, {noFP32, FP32, 50}, {noFP32, BF16, 100}} {
		if got := c.g.Peak(c.p); got != c.want {
			t.Errorf("%s %s: %g, want %g", c.g.Name, c.p, got, c.want)
		}
	}
}

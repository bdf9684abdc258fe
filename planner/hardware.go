package planner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// GPU is one accelerator model: how much memory it has and how fast its
// dense matrix units are. A CPU rank of the built-in engine is described the
// same way (CPUTopology).
type GPU struct {
	Name        string `json:"name"`
	MemoryBytes int64  `json:"memory_bytes"`
	// PeakFLOPS is the dense 16-bit (bf16/fp16) tensor FLOP/s of the data
	// sheet, without sparsity.
	PeakFLOPS float64 `json:"peak_flops"`
	// PeakFP32FLOPS is what fp32 training runs at: TF32 tensor cores where
	// the GPU has them (frameworks enable TF32 for fp32 matrix multiplies),
	// else plain fp32. 0 means half of PeakFLOPS.
	PeakFP32FLOPS float64 `json:"peak_fp32_flops,omitempty"`
	// MemoryBytesPerSec is the data sheet's memory bandwidth, bytes per
	// second: memory-bound kernels (LayerNorm, softmax, dropout, GELU, the
	// optimizer step) run at a fraction of it. 0 means unknown: they are
	// not charged, and small models are predicted too fast.
	MemoryBytesPerSec float64 `json:"memory_bytes_per_s,omitempty"`
	// GEMMHalf is the matrix dimension at which a multiply runs at half its
	// plateau rate (kernels.go, gemm.efficiency); 0 means a GPU's 128, its
	// tiles of 128–256 rows and columns filled worse by small dimensions.
	// A CPU core's register tiles are a few rows wide (CPUTopology).
	GEMMHalf float64 `json:"gemm_half,omitempty"`
	// NoBF16 marks GPUs without bfloat16 (V100): bf16 layouts are refused.
	NoBF16 bool `json:"no_bf16,omitempty"`
}

// Link is a connection: the GPU-to-GPU link inside a node (bandwidth per GPU)
// or a node's network (bandwidth per node, summed over its NICs). Rates are
// per direction, in gigabits per second, as NICs are sold.
type Link struct {
	Kind     string  `json:"kind"`            // nvswitch, nvlink, xgmi, pcie4, pcie5, shm; ib, roce, eth, efa; none
	Count    int     `json:"count,omitempty"` // parallel links, e.g. NICs per node (0 means 1)
	GbitPerS float64 `json:"gbit_per_s"`      // per link
}

// BytesPerSec is the link's total rate in bytes per second.
func (l Link) BytesPerSec() float64 { return float64(max(l.Count, 1)) * l.GbitPerS * 1e9 / 8 }

// String is the parseable form: kind:NxRATE, kind:RATE, or none.
func (l Link) String() string {
	if l.Kind == "none" || l.GbitPerS == 0 {
		return "none"
	}
	rate := strconv.FormatFloat(l.GbitPerS, 'g', -1, 64)
	if l.Count > 1 {
		return fmt.Sprintf("%s:%dx%s", l.Kind, l.Count, rate)
	}
	return l.Kind + ":" + rate
}

// Describe is the link for people: "ib 4x200 Gb/s (100 GB/s)".
func (l Link) Describe() string {
	if l.Kind == "none" || l.GbitPerS == 0 {
		return "none"
	}
	gbs := strconv.FormatFloat(l.BytesPerSec()/1e9, 'g', 4, 64)
	if l.Count > 1 {
		return fmt.Sprintf("%s %dx%s Gb/s (%s GB/s)", l.Kind, l.Count, strconv.FormatFloat(l.GbitPerS, 'g', -1, 64), gbs)
	}
	return fmt.Sprintf("%s %s GB/s", l.Kind, gbs)
}

// linkKinds are the kinds ParseLink accepts, intra-node and network.
var linkKinds = map[string]bool{
	"nvswitch": true, "nvlink": true, "xgmi": true, "pcie4": true, "pcie5": true, "shm": true,
	"ib": true, "roce": true, "eth": true, "efa": true,
}

// ParseLink reads a link: "ib:4x200" (4 links of 200 Gb/s), "eth:100",
// "nvswitch:300GB" (a GB suffix means gigabytes per second), or "none".
// Kinds: nvswitch, nvlink, xgmi, pcie4, pcie5, shm, ib, roce, eth, efa.
func ParseLink(s string) (Link, error) {
	if strings.TrimSpace(s) == "none" {
		return Link{Kind: "none"}, nil
	}
	kind, rate, ok := strings.Cut(strings.TrimSpace(s), ":")
	kind = strings.ToLower(kind)
	if !ok || !linkKinds[kind] {
		return Link{}, fmt.Errorf("link %q: want kind:RATE or kind:NxRATE in Gb/s (kind one of %s), e.g. ib:4x200, or none", s, strings.Join(sortedKeys(linkKinds), ", "))
	}
	l := Link{Kind: kind, Count: 1}
	if n, r, ok := strings.Cut(rate, "x"); ok {
		c, err := strconv.Atoi(n)
		if err != nil || c < 1 || c > 1024 {
			return Link{}, fmt.Errorf("link %q: link count %q: want 1-1024", s, n)
		}
		l.Count, rate = c, r
	}
	scale := 1.0
	if r, ok := strings.CutSuffix(rate, "GB"); ok {
		rate, scale = r, 8 // GB/s to Gb/s
	} else {
		rate = strings.TrimSuffix(rate, "G")
	}
	v, err := strconv.ParseFloat(rate, 64)
	// The bound is on Gb/s, after the GB scaling: "nvswitch:200000GB" is
	// 1.6e6 Gb/s, over it, and would not parse back from its String.
	if err != nil || math.IsNaN(v) || v <= 0 || v*scale > 1e6 {
		return Link{}, fmt.Errorf("link %q: rate %q: want a positive number of Gb/s (or GB/s with a GB suffix), at most 1e6 Gb/s", s, rate)
	}
	l.GbitPerS = v * scale
	return l, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Topology describes a cluster: Nodes identical nodes of GPUsPerNode GPUs,
// the link between GPUs of a node, and each node's network. It is the value
// `gtrain plan --topology file.json` reads and GPU detection produces.
type Topology struct {
	Nodes       int  `json:"nodes"`
	GPUsPerNode int  `json:"gpus_per_node"`
	GPU         GPU  `json:"gpu"`
	Intra       Link `json:"intra"` // per GPU
	Inter       Link `json:"inter"` // per node; "none" on one node
}

// GPUs is the number of devices, Nodes × GPUsPerNode.
func (t Topology) GPUs() int { return t.Nodes * t.GPUsPerNode }

// Validate reports the first field that makes t unusable.
func (t Topology) Validate() error {
	switch {
	case t.Nodes < 1 || t.GPUsPerNode < 1:
		return fmt.Errorf("topology: nodes %d, gpus_per_node %d: each must be at least 1", t.Nodes, t.GPUsPerNode)
	case t.Nodes > 1<<20 || t.GPUsPerNode > 1<<12:
		return fmt.Errorf("topology: nodes %d, gpus_per_node %d: too large", t.Nodes, t.GPUsPerNode)
	case t.GPU.MemoryBytes <= 0 || !(t.GPU.PeakFLOPS > 0) || t.GPU.PeakFLOPS > 1e18 || t.GPU.PeakFP32FLOPS < 0 || t.GPU.PeakFP32FLOPS > 1e18:
		return fmt.Errorf("topology: gpu %q: memory_bytes and peak_flops must be positive", t.GPU.Name)
	case !(t.GPU.MemoryBytesPerSec >= 0 && t.GPU.MemoryBytesPerSec <= 1e16):
		return fmt.Errorf("topology: gpu %q: memory_bytes_per_s %g: want 0 (unknown) or the data sheet's bandwidth, e.g. 2.039e12 for an A100-80GB", t.GPU.Name, t.GPU.MemoryBytesPerSec)
	case t.GPUsPerNode > 1 && !(t.Intra.BytesPerSec() > 0):
		return errors.New("topology: intra: a node with several GPUs needs a link between them, e.g. nvswitch:2400 (Gb/s)")
	case t.Nodes > 1 && !(t.Inter.BytesPerSec() > 0):
		return errors.New("topology: inter: several nodes need a network, e.g. ib:4x200")
	case !(t.GPU.GEMMHalf >= 0 && t.GPU.GEMMHalf <= 1e6):
		return fmt.Errorf("topology: gpu %q: gemm_half %g: want 0 (a GPU's) or a matrix dimension up to 1e6", t.GPU.Name, t.GPU.GEMMHalf)
	case t.Intra.Count < 0 || t.Inter.Count < 0 || math.IsNaN(t.Intra.GbitPerS) || math.IsNaN(t.Inter.GbitPerS):
		return errors.New("topology: link count and rate must not be negative")
	}
	return nil
}

// ParseTopology decodes a Topology from JSON (unknown fields are errors: a
// misspelt key silently ignored would plan for the wrong cluster) and
// validates it.
func ParseTopology(data []byte) (Topology, error) {
	var t Topology
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Topology{}, fmt.Errorf("topology: %w", err)
	}
	if dec.More() {
		return Topology{}, errors.New("topology: more than one JSON value")
	}
	return t, t.Validate()
}

// Peak is the FLOP/s of g's matrix units at precision p: PeakFLOPS for
// 16-bit, PeakFP32FLOPS (or half of PeakFLOPS) for fp32.
func (g GPU) Peak(p Precision) float64 {
	if p == FP32 {
		if g.PeakFP32FLOPS > 0 {
			return g.PeakFP32FLOPS
		}
		return g.PeakFLOPS / 2
	}
	return g.PeakFLOPS
}

// CatalogEntry is a GPU with the links of the systems it usually comes in
// (DGX/HGX-style for SXM parts, PCIe cards otherwise).
type CatalogEntry struct {
	GPU   GPU
	Intra Link // per GPU
	Inter Link // per node of 8 such GPUs
	Note  string
}

const gib = 1 << 30

// Catalog holds the GPUs `--gpu` names. FLOP/s are NVIDIA's and AMD's data
// sheets' dense (not sparse) tensor figures; memory is the marketed GiB (the
// usable fraction covers the CUDA context and what nvidia-smi shows missing)
// and its bandwidth the data sheets' (HBM or GDDR).
// The links are the per-direction NVLink/xGMI/PCIe rates of that generation
// and the usual 200/400 Gb/s NIC per GPU of DGX/HGX systems; override them
// with --intra and --inter.
var Catalog = map[string]CatalogEntry{
	"A100-40GB": {GPU{Name: "A100-40GB", MemoryBytes: 40 * gib, PeakFLOPS: 312e12, PeakFP32FLOPS: 156e12, MemoryBytesPerSec: 1555e9},
		Link{Kind: "nvswitch", Count: 12, GbitPerS: 200}, Link{Kind: "ib", Count: 8, GbitPerS: 200}, "SXM4, NVLink 3 (12 links × 25 GB/s)"},
	"A100-80GB": {GPU{Name: "A100-80GB", MemoryBytes: 80 * gib, PeakFLOPS: 312e12, PeakFP32FLOPS: 156e12, MemoryBytesPerSec: 2039e9},
		Link{Kind: "nvswitch", Count: 12, GbitPerS: 200}, Link{Kind: "ib", Count: 8, GbitPerS: 200}, "SXM4, NVLink 3 (12 links × 25 GB/s)"},
	"H100": {GPU{Name: "H100", MemoryBytes: 80 * gib, PeakFLOPS: 989e12, PeakFP32FLOPS: 494.5e12, MemoryBytesPerSec: 3350e9},
		Link{Kind: "nvswitch", Count: 18, GbitPerS: 200}, Link{Kind: "ib", Count: 8, GbitPerS: 400}, "SXM5, NVLink 4 (18 links × 25 GB/s)"},
	"H100-PCIE": {GPU{Name: "H100-PCIE", MemoryBytes: 80 * gib, PeakFLOPS: 756e12, PeakFP32FLOPS: 378e12, MemoryBytesPerSec: 2000e9},
		Link{Kind: "pcie5", GbitPerS: 512}, Link{Kind: "ib", Count: 8, GbitPerS: 400}, "PCIe 5.0 x16 (64 GB/s)"},
	"H200": {GPU{Name: "H200", MemoryBytes: 141 * gib, PeakFLOPS: 989e12, PeakFP32FLOPS: 494.5e12, MemoryBytesPerSec: 4800e9},
		Link{Kind: "nvswitch", Count: 18, GbitPerS: 200}, Link{Kind: "ib", Count: 8, GbitPerS: 400}, "SXM5, NVLink 4, 141 GB HBM3e"},
	"V100-32GB": {GPU{Name: "V100-32GB", MemoryBytes: 32 * gib, PeakFLOPS: 125e12, PeakFP32FLOPS: 15.7e12, MemoryBytesPerSec: 900e9, NoBF16: true},
		Link{Kind: "nvlink", Count: 6, GbitPerS: 200}, Link{Kind: "ib", Count: 4, GbitPerS: 100}, "SXM2, NVLink 2 (6 links × 25 GB/s); fp16 only"},
	"L40S": {GPU{Name: "L40S", MemoryBytes: 48 * gib, PeakFLOPS: 362e12, PeakFP32FLOPS: 183e12, MemoryBytesPerSec: 864e9},
		Link{Kind: "pcie4", GbitPerS: 256}, Link{Kind: "eth", Count: 4, GbitPerS: 200}, "PCIe 4.0 x16 (32 GB/s), no NVLink"},
	"A10": {GPU{Name: "A10", MemoryBytes: 24 * gib, PeakFLOPS: 125e12, PeakFP32FLOPS: 62.5e12, MemoryBytesPerSec: 600e9},
		Link{Kind: "pcie4", GbitPerS: 256}, Link{Kind: "eth", Count: 1, GbitPerS: 100}, "PCIe 4.0 x16 (32 GB/s)"},
	"MI300X": {GPU{Name: "MI300X", MemoryBytes: 192 * gib, PeakFLOPS: 1307.4e12, PeakFP32FLOPS: 653.7e12, MemoryBytesPerSec: 5300e9},
		Link{Kind: "xgmi", Count: 7, GbitPerS: 512}, Link{Kind: "roce", Count: 8, GbitPerS: 400}, "Infinity Fabric (7 links × 64 GB/s)"},
}

// LookupGPU finds a catalog entry by name, ignoring case and a few spellings
// ("a100" is the 80 GB part, "h100-sxm" the H100).
func LookupGPU(name string) (CatalogEntry, error) {
	key := strings.ToUpper(strings.TrimSpace(name))
	key = strings.NewReplacer("_", "-", " ", "-", "-SXM", "").Replace(key)
	switch key {
	case "A100":
		key = "A100-80GB"
	case "V100":
		key = "V100-32GB"
	case "A100-40", "A100-80":
		key += "GB"
	}
	for k, e := range Catalog {
		if strings.EqualFold(k, key) {
			return e, nil
		}
	}
	return CatalogEntry{}, fmt.Errorf("gpu %q: not in the catalog: want one of %s (or describe it in --topology)", name, strings.Join(sortedKeys(Catalog), ", "))
}

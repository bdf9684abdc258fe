package detect

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// FormatList writes ids as Linux writes a CPU list, "0-3,8-11": runs of
// consecutive ids in the order given.
func FormatList(ids []int) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ids[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ids[j]))
		}
		i = j + 1
	}
	return b.String()
}

// WriteMatrix writes h's GPU matrix as `nvidia-smi topo -m` prints it:
// a row per GPU with its cell to every GPU, its CPU Affinity and its NUMA
// Affinity (N/A when unknown), then the legend. nvidia-smi's NIC columns
// are left out: NVML gives no GPU-to-NIC path, and the NICs' NUMA nodes
// are in hosts check. A host without GPUs gets one line saying why.
func WriteMatrix(w io.Writer, h hostinfo.Host) error {
	if len(h.GPUs) == 0 {
		_, err := fmt.Fprintf(w, "no GPUs: %s\n", orUnknown(h.GPUError))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 1, '\t', 0)
	fmt.Fprint(tw, "\t")
	for _, g := range h.GPUs {
		fmt.Fprintf(tw, "GPU%d\t", g.Index)
	}
	fmt.Fprintln(tw, "CPU Affinity\tNUMA Affinity")
	for i, g := range h.GPUs {
		fmt.Fprintf(tw, "GPU%d\t", g.Index)
		for j := range h.GPUs {
			cell := "?"
			if i < len(h.Matrix) && j < len(h.Matrix[i]) {
				cell = h.Matrix[i][j].String()
			}
			fmt.Fprintf(tw, " %s\t", cell)
		}
		numa := "N/A"
		if g.NUMANode >= 0 {
			numa = strconv.Itoa(g.NUMANode)
		}
		fmt.Fprintf(tw, "%s\t%s\n", orNA(FormatList(g.CPUs)), numa)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, matrixLegend)
	return err
}

// matrixLegend is nvidia-smi's.
const matrixLegend = `
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
`

func orNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "none found"
	}
	return s
}

// Describe writes h for people, a few lines: CPUs, NUMA nodes, GPUs (model,
// memory, NVLink or PCIe), NICs and problems; every line starts with
// indent.
func Describe(w io.Writer, h hostinfo.Host, indent string) error {
	var b strings.Builder
	c := h.CPU
	fmt.Fprintf(&b, "%scpu: %d socket(s), %d core(s), %d thread(s)%s%s\n", indent, c.Sockets, c.Cores, c.Threads, ifSet(", ", c.Model), cgroupNote(h.Cgroup))
	for _, n := range h.NUMA {
		fmt.Fprintf(&b, "%snuma %d: cpus %s, %s\n", indent, n.ID, orNA(FormatList(n.CPUs)), gib(n.MemoryBytes))
	}
	if len(h.GPUs) == 0 {
		fmt.Fprintf(&b, "%sgpus: none: %s\n", indent, orUnknown(h.GPUError))
	} else {
		fmt.Fprintf(&b, "%sdriver %s, CUDA %s\n", indent, orNA(h.Driver), orNA(h.CUDA))
	}
	for _, g := range h.GPUs {
		fmt.Fprintf(&b, "%sgpu %d: %s, %s, %s, numa %s%s\n", indent, g.Index, g.Name, gib(g.MemoryBytes), gpuLink(g), numaText(g.NUMANode), map[bool]string{true: ", MIG on"}[g.MIG])
	}
	for _, n := range h.NICs {
		fmt.Fprintf(&b, "%snic %s: %s%s, %s, numa %s\n", indent, n.Name, n.Kind, ifSet(" ", n.Device), rate(n), numaText(n.NUMANode))
	}
	for _, p := range h.Problems {
		fmt.Fprintf(&b, "%sproblem: %s\n", indent, p)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ifSet(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

func gib(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

func numaText(n int) string {
	if n < 0 {
		return "unknown"
	}
	return strconv.Itoa(n)
}

// gpuLink is a GPU's NVLinks in a few words, "NVLink 4 x18 (NVSwitch)", or
// "PCIe" without.
func gpuLink(g hostinfo.GPU) string {
	n, version, sw := 0, 0, false
	for _, l := range g.NVLinks {
		if l.Active {
			n, version, sw = n+1, max(version, l.Version), sw || l.ToSwitch
		}
	}
	if n == 0 {
		return "PCIe"
	}
	s := fmt.Sprintf("NVLink %d x%d", version, n)
	if sw {
		s += " (NVSwitch)"
	}
	return s
}

// rate is a NIC's state and speed.
func rate(n hostinfo.NIC) string {
	switch {
	case !n.Up:
		return "down"
	case n.GbitPerS == 0:
		return "up, speed unknown"
	}
	return "up, " + strconv.FormatFloat(n.GbitPerS, 'g', -1, 64) + " Gb/s"
}

// cgroupNote is the cgroup's limits, when it has any.
func cgroupNote(c hostinfo.Cgroup) string {
	var parts []string
	if c.CPUs > 0 {
		parts = append(parts, strconv.FormatFloat(c.CPUs, 'g', 4, 64)+" CPUs")
	}
	if len(c.CPUSet) > 0 {
		parts = append(parts, "cpuset "+FormatList(c.CPUSet))
	}
	if c.MemoryBytes > 0 {
		parts = append(parts, gib(c.MemoryBytes))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; cgroup limits " + strings.Join(parts, ", ")
}

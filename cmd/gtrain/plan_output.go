package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/charmbracelet/lipgloss"

	"github.com/gtrain/gtrain/planner"
)

// planDoc is the JSON of `gtrain plan -o json`.
type planDoc struct {
	Model       planModel           `json:"model"`
	Topology    planner.Topology    `json:"topology"`
	GlobalBatch int                 `json:"global_batch"`
	Precision   planner.Precision   `json:"precision"`
	Options     planner.Options     `json:"options"`
	Usable      float64             `json:"usable_memory_bytes"`
	Evaluated   int                 `json:"evaluated"`
	Feasible    int                 `json:"feasible"`
	Pruned      int                 `json:"pruned"`
	Best        *planner.Candidate  `json:"best"`
	Explain     *planExplain        `json:"explain,omitempty"`
	Candidates  []planner.Candidate `json:"candidates"`
}

type planModel struct {
	planner.Model
	Params float64 `json:"params"`
}

type planExplain struct {
	planner.Detail
	Ranks []planner.Coord `json:"ranks"` // rank r's (dp, pp, tp), for every rank
}

// shown is the candidates a listing shows: with --all every one; otherwise
// the top K feasible and, after them, the K rejected ones that came
// closest (least memory), so a listing always says why the rest failed.
func shown(o *PlanOptions, res planner.Result) []planner.Candidate {
	if o.All {
		return res.Candidates
	}
	feasible := res.Candidates[:min(o.Top, res.Feasible)]
	rejected := res.Candidates[res.Feasible:]
	return append(feasible[:len(feasible):len(feasible)], rejected[:min(o.Top, len(rejected))]...)
}

func printPlanJSON(o *PlanOptions, pr planner.Problem, res planner.Result) error {
	doc := planDoc{Model: planModel{pr.Model, pr.Model.Params()}, Topology: pr.Topology, GlobalBatch: pr.GlobalBatch,
		Precision: pr.Precision, Options: pr.Options, Usable: pr.Usable(), Evaluated: len(res.Candidates),
		Feasible: res.Feasible, Pruned: res.Pruned, Candidates: shown(o, res)}
	if best, ok := res.Best(); ok {
		doc.Best = &best
		if o.Explain {
			doc.Explain = &planExplain{Detail: best.Detail, Ranks: best.Coords()}
		}
	}
	return writeJSON(o.IO.Out, doc)
}

// printPlanText writes the header, the table and, with --explain, the
// chosen layout's breakdown.
func printPlanText(o *PlanOptions, pr planner.Problem, res planner.Result) error {
	var b strings.Builder
	writePlanHeader(&b, pr, res)
	rows := shown(o, res)
	if res.Feasible == 0 && !o.All {
		rows = res.Candidates[:min(o.Top, len(res.Candidates))]
		fmt.Fprintf(&b, "\nno layout fits; the %d closest:\n", len(rows))
	}
	b.WriteString("\n")
	b.WriteString(planTable(o.IO, rows))
	if best, ok := res.Best(); ok {
		fmt.Fprintf(&b, "\nchosen (*): %s\n", layoutLine(best))
		if o.Explain {
			explain(&b, pr, best)
		}
	}
	_, err := io.WriteString(o.IO.Out, b.String())
	return err
}

func writePlanHeader(b *strings.Builder, pr planner.Problem, res planner.Result) {
	m, top := pr.Model, pr.Topology
	name := m.Name
	if name == "" {
		name = "custom"
	}
	fmt.Fprintf(b, "model:    %s (%s): %d layers, hidden %d, %d heads (%d kv), ffn %d, vocab %d, seq %d: %s parameters\n",
		name, m.Arch, m.Layers, m.Hidden, m.Heads, m.KVHeads, m.FFN, m.Vocab, m.Seq, count(m.Params()))
	fmt.Fprintf(b, "cluster:  %d × %s (%d node(s) × %d, %s, %.0f TFLOP/s %s); intra %s, inter %s\n",
		top.GPUs(), top.GPU.Name, top.Nodes, top.GPUsPerNode, planner.GiB(float64(top.GPU.MemoryBytes)),
		top.GPU.Peak(pr.Precision)/1e12, pr.Precision, top.Intra.Describe(), top.Inter.Describe())
	sp := "on"
	if !pr.Options.SequenceParallel {
		sp = "off"
	}
	fmt.Fprintf(b, "training: global batch %d × %d tokens, %s, Adam; efficiency %.2f, usable memory %s (%.0f%%), sequence parallel %s\n",
		pr.GlobalBatch, m.Seq, pr.Precision, pr.Options.Efficiency, planner.GiB(pr.Usable()), pr.Options.UsableMemory*100, sp)
	fmt.Fprintf(b, "searched: %d layouts evaluated (%d more pruned), %d fit\n", len(res.Candidates), res.Pruned, res.Feasible)
}

// VPP is the model chunks per pipeline rank (Megatron-LM's virtual
// pipeline size): 1 runs 1F1B, more the interleaved schedule.
var planHeaders = []string{"", "TP", "PP", "VPP", "DP", "ZERO", "MBS", "GA", "RECOMPUTE", "MEM/GPU", "STEP", "TFLOP/S", "MFU", "BUBBLE", "FIT"}

// planTable renders rows; the first feasible one is the chosen layout,
// marked "*" (and bold, where colour is on). Rejected rows say why.
func planTable(ios *IOStreams, rows []planner.Candidate) string {
	cells := make([][]string, len(rows))
	for i, c := range rows {
		mark, fit := "", "ok"
		if i == 0 && c.Feasible {
			mark = "*"
		}
		if !c.Feasible {
			fit = "NO: " + c.RejectReason
		}
		cells[i] = []string{mark, strconv.Itoa(c.TP), strconv.Itoa(c.PP), strconv.Itoa(c.Chunks()), strconv.Itoa(c.DP), strconv.Itoa(c.ZeroStage),
			strconv.Itoa(c.MicroBatch), strconv.Itoa(c.GradAccum), string(c.Recompute), planner.GiB(c.Memory.Total),
			seconds(c.StepTime), fmt.Sprintf("%.1f", c.TFLOPSPerGPU), fmt.Sprintf("%.1f%%", c.MFU*100),
			fmt.Sprintf("%.3f", c.Bubble), fit}
	}
	cell, colour := tableCell(ios)
	chosen, bad := cell, cell
	if colour {
		chosen, bad = cell.Bold(true).Foreground(lipgloss.Color("2")), cell.Foreground(lipgloss.Color("1"))
	}
	return renderTable(cell, planHeaders, cells, func(row, col int) lipgloss.Style {
		switch {
		case cells[row][0] == "*":
			return chosen
		case !rows[row].Feasible && col == len(planHeaders)-1:
			return bad
		}
		return cell
	})
}

func layoutLine(c planner.Candidate) string {
	return fmt.Sprintf("tp %d × pp %d × dp %d%s, zero %d, micro-batch %d × grad-accum %d, recompute %s: %s per GPU, %s per step, %.1f TFLOP/s per GPU, MFU %.1f%%",
		c.TP, c.PP, c.DP, scheduleNote(c.Layout), c.ZeroStage, c.MicroBatch, c.GradAccum, c.Recompute, planner.GiB(c.Memory.Total),
		seconds(c.StepTime), c.TFLOPSPerGPU, c.MFU*100)
}

// scheduleNote names the pipeline schedule l runs, after its degrees: ""
// without a pipeline.
func scheduleNote(l planner.Layout) string {
	switch l.Schedule() {
	case "interleaved":
		return fmt.Sprintf(" (interleaved 1F1B schedule, %d model chunks per rank)", l.Chunks())
	case "1f1b":
		return " (1F1B schedule)"
	}
	return ""
}

// seconds formats a duration in seconds with 3 significant digits.
func seconds(s float64) string {
	switch {
	case s >= 100:
		return fmt.Sprintf("%.0f s", s)
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.1f ms", s*1e3)
}

// count is 124M, 6.74B, 1.01T.
func count(n float64) string {
	switch {
	case n >= 1e12:
		return fmt.Sprintf("%.3gT", n/1e12)
	case n >= 1e9:
		return fmt.Sprintf("%.3gB", n/1e9)
	}
	return fmt.Sprintf("%.3gM", n/1e6)
}

// noFitError says what to change when nothing fits.
func noFitError(pr planner.Problem, res planner.Result) error {
	if len(res.Candidates) == 0 {
		return fmt.Errorf("plan: no layout to evaluate: unpin some of --tp, --pp, --dp")
	}
	c := res.Candidates[0]
	hint := "change or unpin the knob it names"
	if c.Memory.Total > pr.Usable() {
		hint = "add GPUs, use GPUs with more memory, or unpin --zero/--recompute/--micro-batch"
	}
	return fmt.Errorf("plan: no layout fits on %d × %s; the closest (tp %d pp %d dp %d zero %d mbs %d %s) was rejected: %s; %s",
		pr.Topology.GPUs(), pr.Topology.GPU.Name, c.TP, c.PP, c.DP, c.ZeroStage, c.MicroBatch, c.Recompute, c.RejectReason, hint)
}

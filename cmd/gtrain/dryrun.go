package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/planner"
)

// printJob writes the job of --dry-run, as text or as one JSON
// object. A job of many ranks is megabytes long: printJob stops, returning
// context.Cause(ctx), when ctx is done.
func printJob(ctx context.Context, w io.Writer, p *launch.Job, output string) error {
	bw := bufio.NewWriter(w) // a write per line is a million system calls
	print := printJobText
	if output == "json" {
		print = printJobJSON
	}
	if err := print(ctx, bw, p); err != nil {
		return err
	}
	return bw.Flush()
}

// printJobJSON writes p as json.MarshalIndent would, but a rank at a time:
// the document of the most ranks is hundreds of megabytes, which an encoder
// would hold in memory twice over.
func printJobJSON(ctx context.Context, w io.Writer, p *launch.Job) error {
	head := *p
	head.Ranks = nil
	b, err := json.MarshalIndent(&head, "", "  ")
	if err != nil {
		return err
	}
	// The ranks come last: "ranks": null} becomes the array, written here.
	b, ok := bytes.CutSuffix(b, []byte("null\n}"))
	if !ok || len(p.Ranks) == 0 {
		b, err = json.MarshalIndent(p, "", "  ")
		_, werr := w.Write(append(b, '\n'))
		return cmp.Or(err, werr)
	}
	w.Write(append(b, "[\n    "...))
	for i := range p.Ranks {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if i > 0 {
			io.WriteString(w, ",\n    ")
		}
		if b, err = json.MarshalIndent(&p.Ranks[i], "    ", "  "); err != nil {
			return err
		}
		w.Write(b)
	}
	_, err = io.WriteString(w, "\n  ]\n}\n")
	return err
}

func printJobText(ctx context.Context, w io.Writer, p *launch.Job) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "run id:\t%s\n", p.RunID)
	fmt.Fprintf(tw, "command:\t%s\n", strings.Join(p.Command, " "))
	addr, port := p.MasterAddr, strconv.Itoa(p.MasterPort)
	if addr == "" {
		addr = "(node 0's address, determined at launch)"
	}
	if p.MasterPort == 0 {
		port = "(picked free on node 0 at launch)"
	}
	fmt.Fprintf(tw, "master:\t%s:%s\n", addr, port)
	fmt.Fprintf(tw, "world size:\t%d rank(s) on %d host(s)\n", p.WorldSize, len(p.Hosts))
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "NODE\tHOST\tADDRESS\tSLOTS\tRANKS")
	first, last := rankRanges(p)
	for _, h := range p.Hosts {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d-%d\n", h.Node, h.Name, h.Addr, ints(h.Slots), first[h.Node], last[h.Node])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range p.Ranks {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		fmt.Fprintf(w, "\nrank %d (host %s, local rank %d, slot %d):\n", r.Rank, r.Host, r.LocalRank, r.Slot)
		keys := make([]string, 0, len(r.Env))
		for k := range r.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %s=%s\n", k, r.Env[k])
		}
		writeBind(w, p, r)
	}
	return nil
}

// writeBind writes the binding of rank r: planned, on this machine, or
// left to the agent of its host.
func writeBind(w io.Writer, p *launch.Job, r launch.Rank) {
	b := r.Bind
	switch {
	case p.Bind == "" || p.Bind == launch.BindNone:
		return
	case b == nil:
		fmt.Fprintf(w, "  bind: %s, planned by the agent of %s from its hardware at launch\n", p.Bind, r.Host)
		return
	}
	fmt.Fprintf(w, "  bind: %s: cpus %s (%d threads)", b.Mode, launch.FormatCPUList(b.CPUs), b.Threads)
	if b.MemNode >= 0 {
		fmt.Fprintf(w, ", memory preferred on NUMA node %d", b.MemNode)
	}
	if b.GPU >= 0 {
		fmt.Fprintf(w, ", GPU %d", b.GPU)
	}
	fmt.Fprintln(w)
	keys := make([]string, 0, len(b.Env))
	for k := range b.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "    %s=%s\n", k, b.Env[k])
	}
}

// rankRanges is each node's first and last rank, by node, in one pass over
// the ranks (one per node would be quadratic in a job of 65536 hosts).
func rankRanges(p *launch.Job) (first, last map[int]int) {
	first, last = make(map[int]int, len(p.Hosts)), make(map[int]int, len(p.Hosts))
	for _, h := range p.Hosts {
		first[h.Node], last[h.Node] = -1, -1
	}
	for _, r := range p.Ranks {
		if first[r.Node] < 0 {
			first[r.Node] = r.Rank
		}
		last[r.Node] = r.Rank
	}
	return first, last
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// printJobGrid writes every rank's (dp, pp, tp) in grid, on the host the
// job puts it: planner.Grid.Coord, exactly as gtrain plan --explain prints
// it and the engine splits its groups.
func printJobGrid(ctx context.Context, w io.Writer, p *launch.Job, g planner.Grid) error {
	g.DP = max(p.WorldSize/(g.TP*g.PP), 1) // parallel.dp 0 is every replica the ranks make
	var b strings.Builder
	fmt.Fprintf(&b, "\nrank grid (rank → dp, pp, tp; TP fastest), tp %d × pp %d × dp %d:\n", g.TP, g.PP, g.DP)
	for _, r := range p.Ranks {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		co := g.Coord(r.Rank)
		fmt.Fprintf(&b, "  rank %-5d %-20s dp %-4d pp %-4d tp %d\n", r.Rank, r.Host, co.DP, co.PP, co.TP)
	}
	writeGroups(&b, g)
	_, err := io.WriteString(w, b.String())
	return err
}

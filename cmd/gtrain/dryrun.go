package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gtrain/gtrain/launch"
)

// printPlan writes the launch plan of --dry-run, as text or as one JSON object.
func printPlan(w io.Writer, p *launch.Plan, output string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
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
	for _, h := range p.Hosts {
		first, last := -1, -1
		for _, r := range p.Ranks {
			if r.Node == h.Node {
				if first < 0 {
					first = r.Rank
				}
				last = r.Rank
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d-%d\n", h.Node, h.Name, h.Addr, ints(h.Slots), first, last)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range p.Ranks {
		fmt.Fprintf(w, "\nrank %d (host %s, local rank %d, slot %d):\n", r.Rank, r.Host, r.LocalRank, r.Slot)
		keys := make([]string, 0, len(r.Env))
		for k := range r.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %s=%s\n", k, r.Env[k])
		}
	}
	return nil
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

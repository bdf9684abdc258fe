package commbench

import (
	"fmt"
	"io"
	"strings"
)

// Table prints results as nccl-tests does: a header per collective, then
// one line per size with the out-of-place and in-place figures side by
// side; "n/a" where a collective has no such form.
type Table struct {
	w    io.Writer
	last string // collective of the last row
	err  error
}

// NewTable returns a Table that writes to w.
func NewTable(w io.Writer) *Table { return &Table{w: w} }

// Preamble prints the lines that describe the run.
func (t *Table) Preamble(r Report, cfg Config) {
	hosts := distinct(r.Hosts)
	iters, warm := "auto", "auto"
	if cfg.Iters > 0 {
		iters = fmt.Sprint(cfg.Iters)
	}
	if cfg.Warmup >= 0 {
		warm = fmt.Sprint(cfg.Warmup)
	}
	t.printf("# gtrain bench collectives: %d ranks on %d host(s) (%s)\n", r.WorldSize, len(hosts), strings.Join(hosts, ", "))
	t.printf("# dtype %s, op %s, algorithm %s, iterations %s, warm-up %s, check %v\n",
		DTypeName(cfg.DType), cfg.Op, r.Algorithm, iters, warm, cfg.Check)
	t.printf("# time: median (min-max) over iterations of the slowest rank; algbw = size/time; busbw per nccl-tests\n")
}

const (
	colsFmt = "%12s %12s %9s %6s %5s"                  // a data line's first columns
	headFmt = "#%11s %12s %9s %6s %5s"                 // the same, under the '#'
	timeFmt = "  %9s %9s %9s %7s %7s %6s"              // one variant's figures
	spanFmt = "#%11s %12s %9s %6s %5s  %-51s  %-51s\n" // the variant titles
)

// Row prints one result, with the column header first when the collective
// changes.
func (t *Table) Row(r Result) {
	if r.Collective != t.last {
		t.last = r.Collective
		t.printf("#\n# %s\n", r.Collective)
		t.printf(spanFmt, "", "", "", "", "", center("out-of-place", 51), center("in-place", 51))
		t.printf(headFmt+timeFmt+timeFmt+"\n", "size", "count", "type", "redop", "root",
			"time", "min", "max", "algbw", "busbw", "#wrong", "time", "min", "max", "algbw", "busbw", "#wrong")
		t.printf(headFmt+timeFmt+timeFmt+"\n", "(B)", "(elements)", "", "", "",
			"(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "")
	}
	t.printf(colsFmt, fmt.Sprint(r.SizeBytes), fmt.Sprint(r.Count), r.DType, r.Op, fmt.Sprint(r.Root))
	for _, v := range []*Timing{r.OutOfPlace, r.InPlace} {
		if v == nil {
			t.printf(timeFmt, "n/a", "", "", "", "", "")
			continue
		}
		wrong := "N/A"
		if v.Wrong >= 0 {
			wrong = fmt.Sprint(v.Wrong)
		}
		t.printf(timeFmt, us(v.TimeUS.Median), us(v.TimeUS.Min), us(v.TimeUS.Max),
			fmt.Sprintf("%.2f", v.AlgBW), fmt.Sprintf("%.2f", v.BusBW), wrong)
	}
	t.printf("\n")
}

// Err returns the first write error.
func (t *Table) Err() error { return t.err }

func (t *Table) printf(format string, a ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, format, a...)
	}
}

// us formats microseconds with three significant digits at least.
func us(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func center(s string, w int) string {
	pad := max(w-len(s), 0)
	return strings.Repeat(" ", pad/2) + s + strings.Repeat(" ", pad-pad/2)
}

func distinct(ss []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

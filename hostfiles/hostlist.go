package hostfiles

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// HostlistError reports a Slurm hostlist or SLURM_TASKS_PER_NODE value that
// cannot be read: the string, the 1-based byte column of the problem (0 for
// the whole string) and what is wrong.
type HostlistError struct {
	What   string // "hostlist" or the variable's name
	List   string
	Column int
	Msg    string
}

// Error returns `hostfiles: hostlist "node[3-1]": column 6: range 3-1 runs backwards: ...`.
func (e *HostlistError) Error() string {
	if e.Column > 0 {
		return fmt.Sprintf("hostfiles: %s %q: column %d: %s", e.What, e.List, e.Column, e.Msg)
	}
	return fmt.Sprintf("hostfiles: %s %q: %s", e.What, e.List, e.Msg)
}

// maxHostlistLen bounds the length of a hostlist string; a nodelist of
// MaxHosts hosts compresses to far less.
const maxHostlistLen = 1 << 20

// maxRangeDigits bounds the digits of one number of a range, as Slurm's
// unsigned long does.
const maxRangeDigits = 18

// ExpandHostlist expands a Slurm hostlist, as `scontrol show hostnames`
// does: names separated by commas (or spaces) outside brackets, each a
// prefix with bracketed ranges, "node[01-04,07],gpu-[1-2]". A range's
// numbers keep the width of its low bound ("[08-11]" gives 08 to 11,
// "[9-10]" gives 9 and 10). A name may hold several bracket groups
// ("rack[1-2]-node[01-02]") but must end at the last one's "]", and the
// names come in Slurm's order: the last group varies fastest, then the
// first, second, ... Duplicates are kept, as Slurm keeps them. It refuses
// what Slurm refuses and, unlike Slurm, what Slurm reads leniently (an
// unclosed bracket, "[1-]", spaces inside brackets), and more than
// MaxHosts names in all. Errors are [*HostlistError].
func ExpandHostlist(s string) ([]string, error) {
	if len(s) > maxHostlistLen {
		return nil, &HostlistError{What: "hostlist", List: s[:64] + "...", Msg: fmt.Sprintf("longer than %d bytes: is it a hostlist?", maxHostlistLen)}
	}
	x := &expander{list: s}
	names, err := x.expand()
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, x.fail(0, "no hosts: write names like node[01-04],gpu-1")
	}
	return names, nil
}

// expander expands one hostlist; budget counts what is left of MaxHosts.
type expander struct {
	list  string
	names []string
}

func (x *expander) fail(col int, format string, args ...any) error {
	return &HostlistError{What: "hostlist", List: x.list, Column: col, Msg: fmt.Sprintf(format, args...)}
}

// expand splits the list at separators outside brackets and expands each
// name.
func (x *expander) expand() ([]string, error) {
	start, depth := 0, 0
	for i := 0; i <= len(x.list); i++ {
		c := byte(',')
		if i < len(x.list) {
			c = x.list[i]
		}
		switch {
		case c == '[':
			if depth > 0 {
				return nil, x.fail(i+1, `"[" inside brackets: close the range with "]" first`)
			}
			depth++
		case c == ']':
			if depth == 0 {
				return nil, x.fail(i+1, `"]" without "[": remove it or open the range`)
			}
			depth--
		case depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n'):
			if i > start {
				if err := x.name(start, i); err != nil {
					return nil, err
				}
			}
			start = i + 1
		}
	}
	if depth > 0 {
		return nil, x.fail(len(x.list), `unclosed "[": end the range with "]"`)
	}
	return x.names, nil
}

// group is one bracket group of a name: the text before it (since the
// previous group) and its numbers.
type group struct {
	before string
	nums   []rangeSpec
}

// rangeSpec is lo-hi (lo == hi for one number), printed width digits wide.
type rangeSpec struct {
	lo, hi uint64
	width  int
}

func (r rangeSpec) count() uint64 { return r.hi - r.lo + 1 }

// name expands the name at list[start:end].
func (x *expander) name(start, end int) error {
	groups, tail, err := x.groups(start, end)
	if err != nil {
		return err
	}
	if len(groups) == 0 {
		return x.add(start, []string{tail})
	}
	if tail != "" {
		return x.fail(end, "%q after the last \"]\": Slurm allows text only before and between ranges", tail)
	}
	if n := nameLen(groups); n > 253 {
		return x.fail(start+1, "host names of %d bytes: at most 253", n)
	}
	total := uint64(1)
	for _, g := range groups {
		n := uint64(0)
		for _, r := range g.nums {
			n += r.count()
		}
		total *= n
		if total > uint64(MaxHosts-len(x.names)) {
			return x.fail(start+1, "more than %d hosts in all, the most a job may run on: check the ranges", MaxHosts)
		}
	}
	out := make([]string, 0, total)
	// Slurm's order (hostlist.c): the last group innermost, the others
	// outside it, the second-to-last outermost.
	last := groups[len(groups)-1]
	var walk func(k int, chosen []string)
	walk = func(k int, chosen []string) {
		if k < 0 {
			var prefix strings.Builder
			for i, g := range groups[:len(groups)-1] {
				prefix.WriteString(g.before + chosen[i])
			}
			prefix.WriteString(last.before)
			for _, r := range last.nums {
				for v := r.lo; ; v++ {
					out = append(out, prefix.String()+pad(v, r.width))
					if v == r.hi {
						break
					}
				}
			}
			return
		}
		for _, r := range groups[k].nums {
			for v := r.lo; ; v++ {
				chosen[k] = pad(v, r.width)
				walk(k-1, chosen)
				if v == r.hi {
					break
				}
			}
		}
	}
	walk(len(groups)-2, make([]string, len(groups)))
	return x.add(start, out)
}

// nameLen is the length of the longest name groups expand to, checked
// before expanding so that a long prefix times many numbers is refused
// without being built.
func nameLen(groups []group) int {
	n := 0
	for _, g := range groups {
		w := 0
		for _, r := range g.nums {
			w = max(w, r.width, len(strconv.FormatUint(r.hi, 10)))
		}
		n += len(g.before) + w
	}
	return n
}

// add checks each expanded name and appends it.
func (x *expander) add(start int, names []string) error {
	for _, n := range names {
		if len(n) > 253 || !validName(n) {
			return x.fail(start+1, "host name %q: use letters, digits, \".\", \"-\" and \"_\", not starting with \"-\" or \".\", at most 253 bytes", n)
		}
	}
	if len(x.names)+len(names) > MaxHosts {
		return x.fail(start+1, "more than %d hosts in all, the most a job may run on: check the ranges", MaxHosts)
	}
	x.names = append(x.names, names...)
	return nil
}

// groups splits list[start:end] into its bracket groups and the text after
// the last one.
func (x *expander) groups(start, end int) ([]group, string, error) {
	var gs []group
	i := start
	for {
		open := strings.IndexByte(x.list[i:end], '[')
		if open < 0 {
			return gs, x.list[i:end], nil
		}
		open += i
		closing := open + strings.IndexByte(x.list[open:end], ']')
		nums, err := x.ranges(open+1, closing)
		if err != nil {
			return nil, "", err
		}
		gs = append(gs, group{before: x.list[i:open], nums: nums})
		i = closing + 1
	}
}

// ranges parses the comma-separated ranges in list[start:end].
func (x *expander) ranges(start, end int) ([]rangeSpec, error) {
	var out []rangeSpec
	for i := start; ; {
		j := i + strings.IndexByte(x.list[i:end]+",", ',')
		r, err := x.rangeAt(i, j)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
		if j >= end {
			return out, nil
		}
		i = j + 1
	}
}

// rangeAt parses "lo-hi" or "n" at list[start:end].
func (x *expander) rangeAt(start, end int) (rangeSpec, error) {
	text := x.list[start:end]
	loS, hiS, isRange := strings.Cut(text, "-")
	if !isRange {
		hiS = loS
	}
	lo, err1 := parseRangeNum(loS)
	hi, err2 := parseRangeNum(hiS)
	switch {
	case text == "":
		return rangeSpec{}, x.fail(start+1, "empty range: write numbers like [1-4] or [1,3]")
	case err1 != nil || err2 != nil:
		return rangeSpec{}, x.fail(start+1, "range %q: want a number or lo-hi of up to %d digits, like 01-04", text, maxRangeDigits)
	case hi < lo:
		return rangeSpec{}, x.fail(start+1, "range %s runs backwards: write the low number first, %s-%s", text, hiS, loS)
	case hi-lo >= MaxHosts:
		return rangeSpec{}, x.fail(start+1, "range %s has more than %d hosts, the most a job may run on", text, MaxHosts)
	}
	return rangeSpec{lo: lo, hi: hi, width: len(loS)}, nil
}

// parseRangeNum parses a run of 1 to maxRangeDigits ASCII digits.
func parseRangeNum(s string) (uint64, error) {
	if s == "" || len(s) > maxRangeDigits {
		return 0, errors.New("bad length")
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, errors.New("not a number")
		}
	}
	return strconv.ParseUint(s, 10, 64)
}

// pad formats v with at least width digits, zero-padded.
func pad(v uint64, width int) string {
	s := strconv.FormatUint(v, 10)
	if len(s) < width {
		s = strings.Repeat("0", width-len(s)) + s
	}
	return s
}

// maxTasksPerNode bounds one count of SLURM_TASKS_PER_NODE: ranks on one
// host, as slots= is bounded.
const maxTasksPerNode = MaxSlotsPerHost

// ExpandTasksPerNode expands Slurm's compressed per-node counts, the form
// of SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE: "2(x3),1" is 2, 2,
// 2, 1. what names the variable in errors; nodes is the allocation's node
// count, which the expansion must match (0 = do not check). Each count is
// at most MaxSlotsPerHost, and the expansion at most MaxHosts long.
func ExpandTasksPerNode(what, s string, nodes int) ([]int, error) {
	fail := func(col int, format string, args ...any) error {
		return &HostlistError{What: what, List: s, Column: col, Msg: fmt.Sprintf(format, args...)}
	}
	if len(s) > maxHostlistLen {
		return nil, fail(0, "longer than %d bytes", maxHostlistLen)
	}
	var out []int
	col := 1
	for _, part := range strings.Split(s, ",") {
		n, reps, err := parseTaskCount(part)
		if err != nil {
			return nil, fail(col, "%q: want N or N(xR), like 2(x3),1, with N from 1 to %d", part, maxTasksPerNode)
		}
		if len(out)+reps > MaxHosts {
			return nil, fail(col, "more than %d nodes, the most a job may run on", MaxHosts)
		}
		for range reps {
			out = append(out, n)
		}
		col += len(part) + 1
	}
	if nodes > 0 && len(out) != nodes {
		return nil, fail(0, "counts for %d nodes, but the allocation has %d: is the environment from another job?", len(out), nodes)
	}
	return out, nil
}

// parseTaskCount parses "N" or "N(xR)".
func parseTaskCount(part string) (n, reps int, err error) {
	num, rep, hasRep := strings.Cut(part, "(x")
	reps = 1
	if hasRep {
		rs, ok := strings.CutSuffix(rep, ")")
		r, rerr := parseDigits(rs)
		if !ok || rerr != nil || r < 1 || r > MaxHosts {
			return 0, 0, errors.New("bad repeat")
		}
		reps = r
	}
	n, err = parseDigits(num)
	if err != nil || n < 1 || n > maxTasksPerNode {
		return 0, 0, errors.New("bad count")
	}
	return n, reps, nil
}

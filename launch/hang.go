package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/internal/atomicfile"
	"github.com/gtrain/gtrain/internal/flightrec"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
)

// DefaultHangTimeout is --hang-timeout's default: PyTorch's NCCL watchdog
// gives a collective 10 minutes, and a step that takes longer is rare
// enough to call a hang. Only ranks that report steps are watched.
const DefaultHangTimeout = 10 * time.Minute

// hangDumpWait bounds the wait for the ranks' flight records after the
// dump signal: a stopped rank never writes one.
const hangDumpWait = 15 * time.Second

// HangReportFile is the analysis of the flight records, beside them in
// the attempt's log directory.
const HangReportFile = "hang-report.txt"

// HangError is an attempt that stopped because a rank made no step for
// --hang-timeout while its process lived. Report is the analysis of the
// ranks' flight records: which rank the others wait for, in which call.
type HangError struct {
	// Rank is the rank the others wait for when the flight records name
	// one (Blamed), else the first rank seen to stall: in a synchronous
	// job they all stall together.
	Rank    int
	Host    string
	Blamed  bool
	Step    int64 // the last step the stalled rank reported
	Timeout time.Duration
	Report  string // empty when no log directory held flight records
	Dir     string // where the flight records and the report are; "" without --log-dir
}

// Error is "launch: hang: no step for D after step S; the ranks wait for
// rank R (host H)" (or, with no rank to blame, "rank R (host H) made no
// step after step S for D"), with the report's lines below it.
func (e *HangError) Error() string {
	var sb strings.Builder
	if e.Blamed {
		fmt.Fprintf(&sb, "launch: hang: no step for %v after step %d; the ranks wait for rank %d (host %s)", e.Timeout, e.Step, e.Rank, e.Host)
	} else {
		fmt.Fprintf(&sb, "launch: hang: rank %d (host %s) made no step after step %d for %v", e.Rank, e.Host, e.Step, e.Timeout)
	}
	if e.Report != "" {
		sb.WriteString("; the flight records say:\n")
		sb.WriteString(strings.TrimRight(e.Report, "\n"))
	}
	switch {
	case e.Dir != "":
		fmt.Fprintf(&sb, "\nflight records, goroutine stacks and this report: %s", e.Dir)
	default:
		sb.WriteString(" (run with --log-dir for the ranks' flight records and stacks)")
	}
	return sb.String()
}

// rankStatus is what the launcher reads of a status record; nil: absent.
type rankStatus struct {
	step       *int64
	stepMillis *float64
	waitMillis *float64
	dumpSignal string // the rank takes this signal to dump (the built-in engine: SIGUSR2)
}

// parseStatus reads the fields the launcher watches; a field that is not a
// plain number (a rank's "NaN") is absent.
func parseStatus(raw json.RawMessage) rankStatus {
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return rankStatus{}
	}
	var st rankStatus
	var n int64
	if json.Unmarshal(fields["step"], &n) == nil {
		st.step = &n
	}
	num := func(key string) *float64 {
		var f float64
		if json.Unmarshal(fields[key], &f) != nil {
			return nil
		}
		return &f
	}
	st.stepMillis, st.waitMillis = num("step_ms"), num("comm_wait_ms")
	_ = json.Unmarshal(fields["dump_signal"], &st.dumpSignal)
	return st
}

// stepSeen is a rank's last reported step and when it first reported it.
type stepSeen struct {
	step int64
	at   time.Time
}

// stepWatch finds a rank whose step stopped advancing. It watches only
// ranks that reported a step, from their first, and forgets ranks that
// exited. Not safe for concurrent use: the attempt's loop owns it.
type stepWatch struct {
	timeout  time.Duration // 0: off
	last     map[int]stepSeen
	dumpable map[int]bool
}

func newStepWatch(timeout time.Duration) *stepWatch {
	return &stepWatch{timeout: timeout, last: map[int]stepSeen{}, dumpable: map[int]bool{}}
}

func (w *stepWatch) status(rank int, st rankStatus, now time.Time) {
	if st.dumpSignal == "SIGUSR2" {
		w.dumpable[rank] = true
	}
	if st.step == nil {
		return
	}
	if s, ok := w.last[rank]; !ok || s.step != *st.step {
		w.last[rank] = stepSeen{step: *st.step, at: now}
	}
}

func (w *stepWatch) exited(rank int) { delete(w.last, rank) }

// stalled returns the rank whose step has not changed for longest, if that
// is at least the timeout.
func (w *stepWatch) stalled(now time.Time) (int, stepSeen, bool) {
	best, found := -1, false
	var seen stepSeen
	for _, r := range sortedRanks(w.last) {
		s := w.last[r]
		if w.timeout > 0 && now.Sub(s.at) >= w.timeout && (!found || s.at.Before(seen.at)) {
			best, seen, found = r, s, true
		}
	}
	return best, seen, found
}

// hangState is an attempt's watch for hangs and stragglers.
type hangState struct {
	watch   *stepWatch
	strag   *stragglers
	tick    <-chan time.Time
	stopT   func()
	reports chan *HangError
	fired   bool
	dir     string // the attempt's log directory, absolute; "" without --log-dir
}

// newHang sets up the attempt's watch: a tick of a tenth of the timeout
// (100 ms to 5 s) when --hang-timeout is on.
func (a *attempt) newHang() {
	h := &hangState{watch: newStepWatch(a.rt.HangTimeout), strag: newStragglers(a.rt.StragglerFactor, len(a.p.Ranks)),
		reports: make(chan *HangError, 1), stopT: func() {}}
	if a.rt.LogDir != "" {
		if dir, err := filepath.Abs(filepath.Join(a.rt.LogDir, a.p.RunID, "attempt-"+strconv.Itoa(a.n))); err == nil {
			h.dir = dir
		}
	}
	if a.rt.HangTimeout > 0 {
		t := time.NewTicker(min(max(a.rt.HangTimeout/10, 100*time.Millisecond), 5*time.Second))
		h.tick, h.stopT = t.C, t.Stop
	}
	a.hang = h
}

// withDumpEnv adds to env (copied, since assignments may share it) where
// every rank dumps: the attempt's log directory, when there is one.
func (a *attempt) withDumpEnv(env []string) []string {
	if a.hang == nil || a.hang.dir == "" {
		return env
	}
	return append(slices.Clip(env), rankenv.DumpDir+"="+a.hang.dir)
}

// observeHang feeds the watches with a rank's status records and exits.
func (a *attempt) observeHang(ev proto.Event) {
	if a.hang == nil || ev.Rank < 0 {
		return
	}
	switch ev.Type {
	case proto.EventRankExited:
		a.hang.watch.exited(ev.Rank)
	case proto.EventStatus:
		st := parseStatus(ev.Status)
		a.hang.watch.status(ev.Rank, st, time.Now())
		if st.stepMillis != nil {
			work := *st.stepMillis
			if st.waitMillis != nil {
				work -= *st.waitMillis
			}
			a.markStragglers(a.hang.strag.observe(ev.Rank, work))
		}
	}
}

// checkHang, on the watch's tick, starts the diagnosis of a rank whose step
// stopped advancing: every rank that can is asked to dump, and the records
// are collected in the background (hangReported takes the result).
func (a *attempt) checkHang(ctx context.Context, now time.Time) {
	h := a.hang
	if h.fired || a.stopping {
		return
	}
	rank, seen, ok := h.watch.stalled(now)
	if !ok {
		return
	}
	h.fired = true
	e := &HangError{Rank: rank, Host: a.hostOf(rank), Step: seen.step, Timeout: a.rt.HangTimeout, Dir: h.dir}
	var ranks []int
	for _, r := range sortedRanks(h.watch.dumpable) {
		ranks = append(ranks, r)
	}
	notice(a.view, fmt.Sprintf("rank %d (host %s) made no step after step %d for %v: asking %d ranks for their flight records",
		rank, e.Host, seen.step, a.rt.HangTimeout, len(ranks)))
	if len(ranks) > 0 {
		a.send(proto.Command{V: proto.Version, Type: proto.CommandDump, Reason: "hang", Ranks: ranks})
	}
	hosts := a.rankHosts()
	go func() {
		if h.dir != "" {
			rep := collectReport(ctx, h.dir, ranks, hosts)
			e.Report = rep.String()
			if len(rep.Culprits) == 1 {
				c := rep.Culprits[0]
				e.Rank, e.Host, e.Blamed = c.Rank, c.Host, true
			}
		}
		h.reports <- e
	}()
}

// hangReported writes the report beside the records and stops the attempt.
func (a *attempt) hangReported(e *HangError) {
	if e.Dir != "" && e.Report != "" {
		path := filepath.Join(e.Dir, HangReportFile)
		if err := atomicfile.Write(path, func(w io.Writer) error { _, err := io.WriteString(w, e.Report); return err }); err != nil {
			notice(a.view, fmt.Sprintf("launch: write %s: %v", path, err))
		}
	}
	a.fail(e, "hang")
}

// reportDumps, at the end of an attempt that did not diagnose a hang
// itself, analyses the flight records ranks wrote when a collective of
// theirs failed (a timeout): the same report, as a notice.
func (a *attempt) reportDumps() {
	h := a.hang
	if h == nil || h.fired || h.dir == "" {
		return
	}
	names, _ := filepath.Glob(filepath.Join(h.dir, "rank-*.hang.json"))
	if len(names) == 0 {
		return
	}
	rep := analyzeDir(h.dir, a.rankHosts()).String()
	path := filepath.Join(h.dir, HangReportFile)
	_ = atomicfile.Write(path, func(w io.Writer) error { _, err := io.WriteString(w, rep); return err })
	notice(a.view, "ranks wrote flight records when their collectives failed; they say:\n"+strings.TrimRight(rep, "\n")+"\n(report: "+path+")")
}

// collectReport waits for the flight records of ranks in dir, then
// analyses whatever is there. A live rank answers the signal at once, a
// stopped one never: the wait ends when every record is there, hangDumpSettle
// after the first one came, at hangDumpWait, or when ctx ends.
func collectReport(ctx context.Context, dir string, ranks []int, hosts []string) flightrec.Report {
	deadline := time.NewTimer(hangDumpWait)
	defer deadline.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	var settle <-chan time.Time
	for {
		n := dumped(dir, ranks)
		if n == len(ranks) {
			break
		}
		if n > 0 && settle == nil {
			settle = time.After(hangDumpSettle)
		}
		select {
		case <-ctx.Done():
		case <-deadline.C:
		case <-settle:
		case <-poll.C:
			continue
		}
		break
	}
	return analyzeDir(dir, hosts)
}

// hangDumpSettle is how long the other ranks have to write their records
// once one has: plenty for a live process, which writes them in
// milliseconds, even on a loaded machine.
const hangDumpSettle = 5 * time.Second

// dumped counts the ranks whose flight record is in dir.
func dumped(dir string, ranks []int) int {
	n := 0
	for _, r := range ranks {
		if _, err := os.Stat(dumpPath(dir, r)); err == nil {
			n++
		}
	}
	return n
}

func dumpPath(dir string, rank int) string {
	return filepath.Join(dir, "rank-"+strconv.Itoa(rank)+".hang.json")
}

// analyzeDir reads every rank's flight record in dir (a record that does
// not decode is left out, and named in Report.Unreadable) and analyses them.
func analyzeDir(dir string, hosts []string) flightrec.Report {
	var dumps []*flightrec.Dump
	var bad []string
	for r := range hosts {
		b, err := os.ReadFile(dumpPath(dir, r))
		if err != nil {
			continue
		}
		d, err := flightrec.Decode(bytes.NewReader(b))
		if err != nil || d.Rank != r {
			bad = append(bad, fmt.Sprintf("%s: %v (rank %d?)", dumpPath(dir, r), err, r))
			continue
		}
		dumps = append(dumps, d)
	}
	rep := flightrec.Analyze(len(hosts), hosts, dumps)
	rep.Unreadable = bad
	return rep
}

// rankHosts returns the host of every rank, by rank.
func (a *attempt) rankHosts() []string {
	hosts := make([]string, len(a.p.Ranks))
	for r := range hosts {
		hosts[r] = a.hostOf(r)
	}
	return hosts
}

// markStragglers tells the views of ranks that became, or stopped being,
// stragglers: a straggler event (the JSON stream, the table's mark) and a
// notice.
func (a *attempt) markStragglers(changes []stragglerChange) {
	for _, c := range changes {
		ev := proto.Event{V: proto.Version, Type: proto.EventStraggler, Time: time.Now(), Rank: c.rank, Host: a.hostOf(c.rank), Message: c.why}
		if c.why == "" {
			ev.Type = proto.EventStragglerEnd
			a.view.Event(ev)
			continue
		}
		a.view.Event(ev)
		notice(a.view, fmt.Sprintf("straggler: rank %d (host %s): %s", c.rank, ev.Host, c.why))
	}
}

// summarizeStragglers notes, at the end of an attempt, every rank that was
// a straggler in it.
func (a *attempt) summarizeStragglers() {
	if a.hang == nil {
		return
	}
	for _, c := range a.hang.strag.summary() {
		notice(a.view, fmt.Sprintf("summary: rank %d (host %s) was a straggler: %s", c.rank, a.hostOf(c.rank), c.why))
	}
}

// hostOf is the host of rank, "" if there is no such rank.
func (a *attempt) hostOf(rank int) string {
	if rank >= 0 && rank < len(a.p.Ranks) {
		return a.p.Ranks[rank].Host
	}
	return ""
}

// maxStragglerFactor bounds --straggler-factor: a rank 1000 times slower
// than the others is hung, not straggling.
const maxStragglerFactor = 1000

// checkWatch checks --hang-timeout and --straggler-factor.
func (r *Request) checkWatch() error {
	switch f := r.StragglerFactor; {
	case r.HangTimeout < 0:
		return usage.Errorf("run: --hang-timeout %v: must not be negative (0 turns the watch off)", r.HangTimeout)
	case f != 0 && !(f > 1 && f <= maxStragglerFactor): // !(…) also refuses NaN
		return usage.Errorf("run: --straggler-factor %g: want more than 1 and at most %d (0 turns the marking off)", f, maxStragglerFactor)
	}
	return nil
}

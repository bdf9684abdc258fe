package train

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/atomicfile"
	"github.com/gtrain/gtrain/planner"
)

// MetricsFile is the name of a run's metrics log in its run directory
// (checkpoint.dir): every step's status record as one JSON line.
//
// Rank 0 writes it, as nanoGPT and Megatron-LM log from one rank: the loss,
// learning rate and gradient norm are the job's (every rank has the same),
// tokens/s is the job's, and step_ms, comm_wait_ms, memory and coord are
// rank 0's. At the steps that print a log line (log_every, the first and
// the last, evaluations) the record also holds "ranks", every rank's own
// values (RankMetrics), which an all-gather brings to rank 0: memory and
// step time differ by rank, and gathering them every step would add a
// collective to every step for a file few read at that rate.
//
// The file is appended to after every step and fsynced before each
// checkpoint is committed, so a checkpoint never exists without the records
// up to its step. A run that resumes from the checkpoint of step N first
// cuts the file back to its records up to N (see cutMetrics): the steps
// after N are taken again and their new records replace the old, so the
// file has each step once, in order, whatever was killed when.
const MetricsFile = "metrics.jsonl"

// maxMetricsLine bounds one line of a metrics file as it is read: a record
// with a few thousand ranks fits; anything longer is not one of ours.
const maxMetricsLine = 4 << 20

// RankMetrics is one rank's own values in a MetricsLine.
type RankMetrics struct {
	Rank       int            `json:"rank"`
	Coord      *planner.Coord `json:"coord,omitempty"`
	StepMillis float64        `json:"step_ms"`
	WaitMillis float64        `json:"comm_wait_ms"`
	Memory     MemoryUse      `json:"memory"`
}

// MetricsLine is one line of a metrics file: the status record of a step,
// the wall-clock time it was written (Unix seconds) and, at log steps,
// every rank's own values.
type MetricsLine struct {
	Record
	Time  float64       `json:"time"`
	Ranks []RankMetrics `json:"ranks,omitempty"`
}

// metricsExtra is what a MetricsLine adds to its Record.
type metricsExtra struct {
	Time  float64       `json:"time"`
	Ranks []RankMetrics `json:"ranks,omitempty"`
}

// MarshalJSON writes the record's fields, then time and ranks, in one
// object (Record's own MarshalJSON would otherwise be promoted and drop
// them).
func (m MetricsLine) MarshalJSON() ([]byte, error) {
	rec, err := json.Marshal(m.Record)
	if err != nil {
		return nil, err
	}
	extra, err := json.Marshal(metricsExtra{Time: m.Time, Ranks: m.Ranks})
	if err != nil {
		return nil, err
	}
	// Both are objects: join {a...} and {b...} into {a...,b...}.
	out := append(rec[:len(rec)-1:len(rec)-1], ',')
	return append(out, extra[1:]...), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *MetricsLine) UnmarshalJSON(b []byte) error {
	var extra metricsExtra
	if err := json.Unmarshal(b, &m.Record); err != nil {
		return err
	}
	if err := json.Unmarshal(b, &extra); err != nil {
		return err
	}
	m.Time, m.Ranks = extra.Time, extra.Ranks
	return nil
}

// ReadMetrics reads the metrics file path, calling fn with each line in
// order; it stops at fn's error. A last line without its newline (a write
// cut short by a kill) is not a record and is skipped; any other line that
// does not parse is an error naming the file and line.
func ReadMetrics(path string, fn func(MetricsLine) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	defer f.Close()
	_, err = scanMetrics(f, func(m MetricsLine, _ int64) (bool, error) { return true, fn(m) })
	if err != nil {
		return fmt.Errorf("metrics: %s: %w", path, err)
	}
	return nil
}

// scanMetrics reads complete lines from r, calling fn with each record and
// the offset just past its line, until fn says stop. It returns the offset
// past the last line fn accepted.
func scanMetrics(r io.Reader, fn func(MetricsLine, int64) (bool, error)) (int64, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var off int64
	for n := 1; ; n++ {
		line, err := readLine(br, n)
		if errors.Is(err, io.EOF) {
			return off, nil // end, or a torn last line
		}
		if err != nil {
			return off, err
		}
		var m MetricsLine
		if err := json.Unmarshal(line, &m); err != nil {
			return off, &badLineError{Line: n, Err: err}
		}
		more, err := fn(m, off+int64(len(line)))
		if err != nil || !more {
			return off, err
		}
		off += int64(len(line))
	}
}

// badLineError is a line of a metrics file that is not a record.
type badLineError struct {
	Line int
	Err  error
}

func (e *badLineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *badLineError) Unwrap() error { return e.Err }

// readLine is the next line of br with its newline, at most maxMetricsLine
// bytes; io.EOF when no complete line is left.
func readLine(br *bufio.Reader, n int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		switch {
		case len(line) > maxMetricsLine:
			return nil, &badLineError{Line: n, Err: fmt.Errorf("longer than %d bytes: not a metrics record", maxMetricsLine)}
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		}
		return nil, err
	}
}

// cutMetrics cuts the metrics file path back to its records of steps up to
// step, in order: what follows (the records of steps a resumed run takes
// again, a record torn by a kill, anything out of order) is removed. An
// absent file stays absent.
//
// The cut is an ftruncate of the file in place, then an fsync: the kept
// prefix is never rewritten, so a crash at any moment leaves either the
// whole old file (whose surplus the next resume cuts) or the cut one, and
// never a file without the records the checkpoint's steps had.
func cutMetrics(path string, step int) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	last := 0
	keep, err := scanMetrics(f, func(m MetricsLine, _ int64) (bool, error) {
		ok := m.Step > last && m.Step <= step
		last = m.Step
		return ok, nil
	})
	if bad := new(badLineError); errors.As(err, &bad) {
		err = nil // a line that does not parse ends what can be trusted
	}
	if err != nil {
		return err
	}
	if err := f.Truncate(keep); err != nil {
		return err
	}
	return f.Sync()
}

// metricsLog is rank 0's open metrics file. Its methods are safe to call
// from the goroutine of an asynchronous checkpoint's commit (sync) while
// the training thread appends.
type metricsLog struct {
	mu     sync.Mutex
	path   string
	f      *os.File // opened at the first record: a run that takes no step leaves no file
	failed bool     // a write failed: warned once, no more writes
	warn   func(string)
	tb     metricsSink // log.tensorboard, nil without
}

// metricsSink receives each line after the metrics file: TensorBoard.
type metricsSink interface {
	add(MetricsLine) error
	flush() error
	close() error
}

// openMetrics opens rank 0's metrics file in the run directory, cut back
// to the step the run starts from (t.step). Other ranks, and runs without a
// checkpoint directory, keep none.
func (t *Trainer) openMetrics() error {
	dir := t.spec.Checkpoint.Dir
	if t.env.Rank != 0 || dir == "" {
		return nil
	}
	path := filepath.Join(dir, MetricsFile)
	// A FIFO or device in its place would block or take the records.
	if _, err := atomicfile.Resolve(path); err != nil {
		return fmt.Errorf("train: metrics: %w; remove it", err)
	}
	if err := cutMetrics(path, t.step); err != nil {
		return fmt.Errorf("train: metrics %s: cut back to step %d: %w; move the file aside to start a new one", path, t.step, err)
	}
	t.metrics = &metricsLog{path: path, warn: t.env.Warn}
	if err := t.openTensorBoard(); err != nil {
		t.metrics.close()
		t.metrics = nil
		return err
	}
	return nil
}

// logMetrics appends r, with every rank's values at log steps, to the
// metrics file. Every rank calls it after every step: at log steps the
// ranks all-gather their values.
func (t *Trainer) logMetrics(r Record) {
	var ranks []RankMetrics
	if t.env.World > 1 && t.logStep(r) {
		var err error
		if ranks, err = t.gatherRanks(r); err != nil {
			t.env.Warn(fmt.Sprintf("train: metrics of step %d: gather the ranks' values: %v", r.Step, err))
		}
	}
	if t.metrics != nil {
		t.metrics.add(MetricsLine{Record: r, Time: unixSeconds(time.Now()), Ranks: ranks})
	}
}

// logStep says whether step r prints a log line: every log_every steps,
// the first and the last, and evaluations. Every rank decides alike.
func (t *Trainer) logStep(r Record) bool {
	every := t.spec.LogEvery
	return every > 0 && (r.Step%every == 0 || r.Step == 1 || r.Step == r.Steps || r.ValLoss != nil)
}

func unixSeconds(now time.Time) float64 {
	return float64(now.UnixNano()) / 1e9
}

// add appends m as one line. A failed write is warned about once and ends
// the file's writes: the metrics are not worth stopping training for.
func (l *metricsLog) add(m MetricsLine) {
	b, err := json.Marshal(m)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed {
		return
	}
	if err == nil && l.f == nil {
		l.f, err = atomicfile.OpenAppend(l.path, 0o644)
	}
	if err == nil {
		_, err = l.f.Write(append(b, '\n'))
	}
	if err == nil && l.tb != nil {
		err = l.tb.add(m)
	}
	if err != nil {
		l.failed = true
		l.warn(fmt.Sprintf("train: metrics %s: step %d: %v; no more metrics are written this run", l.path, m.Step, err))
	}
}

// sync makes what was written durable; a checkpoint is committed after it.
func (l *metricsLog) sync() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if l.f != nil {
		err = l.f.Sync()
	}
	if l.tb != nil {
		err = errors.Join(err, l.tb.flush())
	}
	if err != nil {
		return fmt.Errorf("metrics %s: %w", l.path, err)
	}
	return nil
}

// close syncs and closes the file.
func (l *metricsLog) close() error {
	if l == nil {
		return nil
	}
	err := l.sync()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		err = errors.Join(err, l.f.Close())
	}
	if l.tb != nil {
		err = errors.Join(err, l.tb.close())
	}
	return err
}

// rankWords is the size of one rank's values in gatherRanks, in the
// 16-bit words the all-gather moves: 7 int64 memory figures, 3 coordinates
// as int32 and 2 float64 times.
const rankWords = (7*8 + 3*4 + 2*8) / 2

// gatherRanks is every rank's own values of step r, all-gathered (every
// rank blocks until all have sent, as in the step's own collectives, so a
// stopped rank stalls every other in the same operation). The values
// travel as raw bits: a gather moves bytes and reduces nothing.
func (t *Trainer) gatherRanks(r Record) ([]RankMetrics, error) {
	mine := make([]uint16, rankWords)
	putRank(mine, r)
	all := make([]uint16, rankWords*t.env.World)
	if err := t.env.Comm.AllGather(t.ctx(), comm.BF16(mine), comm.BF16(all)); err != nil {
		return nil, err
	}
	ranks := make([]RankMetrics, t.env.World)
	for i := range ranks {
		ranks[i] = getRank(all[i*rankWords:(i+1)*rankWords], i, r.Coord != nil)
	}
	return ranks, nil
}

// putRank packs r's own values into w (rankWords long).
func putRank(w []uint16, r Record) {
	b := make([]byte, 2*rankWords)
	m := r.Memory
	for i, v := range []int64{m.Params, m.Grads, m.Optimizer, m.Activations, m.Buffers, m.Snapshot, m.Total} {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	var c planner.Coord
	if r.Coord != nil {
		c = *r.Coord
	}
	for i, v := range []int{c.DP, c.PP, c.TP} {
		binary.LittleEndian.PutUint32(b[56+4*i:], uint32(v))
	}
	binary.LittleEndian.PutUint64(b[68:], math.Float64bits(r.StepMillis))
	binary.LittleEndian.PutUint64(b[76:], math.Float64bits(r.WaitMillis))
	for i := range w {
		w[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
}

// getRank unpacks rank's values from w.
func getRank(w []uint16, rank int, coord bool) RankMetrics {
	b := make([]byte, 2*rankWords)
	for i, v := range w {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	i64 := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
	i32 := func(i int) int { return int(int32(binary.LittleEndian.Uint32(b[56+4*i:]))) }
	rm := RankMetrics{
		Rank: rank,
		Memory: MemoryUse{Params: i64(0), Grads: i64(1), Optimizer: i64(2), Activations: i64(3),
			Buffers: i64(4), Snapshot: i64(5), Total: i64(6)},
		StepMillis: math.Float64frombits(binary.LittleEndian.Uint64(b[68:])),
		WaitMillis: math.Float64frombits(binary.LittleEndian.Uint64(b[76:])),
	}
	if coord {
		rm.Coord = &planner.Coord{DP: i32(0), PP: i32(1), TP: i32(2)}
	}
	return rm
}

// closeMetrics closes rank 0's metrics file at the end of the run.
func (t *Trainer) closeMetrics() {
	if err := t.metrics.close(); err != nil {
		t.env.Warn(fmt.Sprintf("train: %v", err))
	}
}

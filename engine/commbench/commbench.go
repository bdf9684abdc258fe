// Package commbench measures the collectives of engine/comm the way
// nccl-tests measures NCCL's: for each collective and message size it times
// every iteration after a warm-up, takes the slowest rank's time for each
// (a collective is done when its last rank is), and reports the median,
// minimum and maximum, the algorithm and bus bandwidths, and the number of
// wrong elements in a checked run. `gtrain bench collectives` runs it in
// every rank of a job.
package commbench

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
)

// Collectives lists the collectives Run knows, in the order it runs them.
var Collectives = []string{"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "sendrecv"}

// Config says what to measure. Sizes go from MinBytes to MaxBytes,
// multiplied by StepFactor each time; a size is the whole buffer of the
// collective (the all-reduce buffer, the reduce-scatter input, the
// all-gather output), rounded down to whole elements (and to a multiple of
// the group size for reduce-scatter and all-gather), as in nccl-tests.
type Config struct {
	Collectives        []string // default all_reduce
	DType              comm.DType
	Op                 comm.Op
	Root               int
	MinBytes, MaxBytes int64
	StepFactor         int64
	// Iters and Warmup are per size. Iters 0 picks from the size: about
	// 256 MiB of buffer per size, at least 20 and at most 1000 iterations.
	// Warmup -1 picks a tenth as many warm-ups, at least 5.
	Iters, Warmup int
	// Check runs each collective once more on known data and counts the
	// elements that differ from a reference reduction.
	Check bool
}

// Check validates cfg.
func (cfg Config) validate(size int) error {
	var errs []error
	for _, c := range cfg.Collectives {
		if !slices.Contains(Collectives, c) {
			errs = append(errs, fmt.Errorf("unknown collective %q (want %s)", c, strings.Join(Collectives, ", ")))
		}
	}
	switch {
	case cfg.MinBytes < 1 || cfg.MaxBytes < cfg.MinBytes:
		errs = append(errs, fmt.Errorf("sizes %d to %d bytes: want 1 <= min <= max", cfg.MinBytes, cfg.MaxBytes))
	case cfg.MaxBytes > 16<<30:
		errs = append(errs, fmt.Errorf("max size %d bytes is over the limit of 16 GiB", cfg.MaxBytes))
	}
	if cfg.StepFactor < 2 && cfg.MinBytes != cfg.MaxBytes {
		errs = append(errs, fmt.Errorf("step factor %d: want 2 or more", cfg.StepFactor))
	}
	if cfg.Iters < 0 || cfg.Warmup < -1 {
		errs = append(errs, fmt.Errorf("%d iterations and %d warm-ups: want iterations >= 0 (0: auto) and warm-ups >= -1 (-1: auto)", cfg.Iters, cfg.Warmup))
	}
	if cfg.Root < 0 || cfg.Root >= size {
		errs = append(errs, fmt.Errorf("root %d out of range for %d ranks", cfg.Root, size))
	}
	if cfg.DType.Size() == 0 {
		errs = append(errs, errors.New("no dtype"))
	}
	return errors.Join(errs...)
}

// Stats summarises per-iteration times, in microseconds. Mean is what
// nccl-tests reports (time over iterations run back to back); where a
// link lets bursts go faster than its rate (a token bucket), the median
// favours a library whose few slow calls pay for many fast ones, and the
// mean does not.
type Stats struct {
	Median float64 `json:"median"`
	Mean   float64 `json:"mean"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Timing is one variant (out-of-place or in-place) of one measurement.
type Timing struct {
	TimeUS Stats   `json:"time_us"`
	AlgBW  float64 `json:"algbw_gbps"` // size / median time, in 10^9 bytes/s
	BusBW  float64 `json:"busbw_gbps"` // algbw times the collective's bus factor
	// Wrong counts the elements that differ from the reference on all
	// ranks together; -1 when not checked.
	Wrong int64 `json:"wrong"`
}

// Result is one collective at one size.
type Result struct {
	Collective string  `json:"collective"`
	SizeBytes  int64   `json:"size_bytes"`
	Count      int     `json:"count"` // elements of the whole buffer
	DType      string  `json:"dtype"`
	Op         string  `json:"op"`   // "none" for collectives that do not reduce
	Root       int     `json:"root"` // -1 for collectives without a root
	Iters      int     `json:"iters"`
	OutOfPlace *Timing `json:"out_of_place,omitempty"` // nil where the API is in place only
	InPlace    *Timing `json:"in_place,omitempty"`     // nil where there is no in-place form
}

// Report is what rank 0 prints as JSON.
type Report struct {
	WorldSize int      `json:"world_size"`
	Hosts     []string `json:"hosts"` // host of each rank
	Algorithm string   `json:"algorithm"`
	Results   []Result `json:"results"`
}

// DTypeName is the name the reports use for dt.
func DTypeName(dt comm.DType) string {
	switch dt {
	case comm.Float32:
		return "float32"
	case comm.BFloat16:
		return "bfloat16"
	case comm.Float16:
		return "float16"
	}
	return dt.String()
}

// Run measures every configured collective at every size over c, calling
// emit (on every rank, with the same values) after each result. Every
// rank of c must call Run with the same cfg.
func Run(ctx context.Context, c *comm.Communicator, cfg Config, emit func(Result)) error {
	if len(cfg.Collectives) == 0 {
		cfg.Collectives = []string{"all_reduce"}
	}
	if err := cfg.validate(c.Size()); err != nil {
		return fmt.Errorf("commbench: %w", err)
	}
	for _, name := range cfg.Collectives {
		for size := cfg.MinBytes; size <= cfg.MaxBytes; size *= max(cfg.StepFactor, 2) {
			res, err := measure(ctx, c, cfg, name, size)
			if err != nil {
				return fmt.Errorf("commbench: %s, %d bytes: %w", name, size, err)
			}
			emit(res)
		}
	}
	return nil
}

// iterations returns the iteration and warm-up counts for a size.
func (cfg Config) iterations(size int64) (iters, warmup int) {
	iters, warmup = cfg.Iters, cfg.Warmup
	if iters == 0 {
		iters = int(min(max((256<<20)/max(size, 1), 20), 1000))
	}
	if warmup < 0 {
		warmup = max(iters/10, 5)
	}
	return iters, warmup
}

func measure(ctx context.Context, c *comm.Communicator, cfg Config, name string, size int64) (Result, error) {
	p := c.Size()
	count := int(size / int64(cfg.DType.Size()))
	if name == "reduce_scatter" || name == "all_gather" {
		count -= count % p
	}
	count = max(count, 0)
	iters, warmup := cfg.iterations(size)
	res := Result{
		Collective: name, Count: count, SizeBytes: int64(count * cfg.DType.Size()),
		DType: DTypeName(cfg.DType), Op: "none", Root: -1, Iters: iters,
	}
	k := newCase(name, c.Rank(), p, cfg, count)
	if k.reduces {
		res.Op = cfg.Op.String()
	}
	if k.rooted {
		res.Root = cfg.Root
	}
	for _, inPlace := range []bool{false, true} {
		if !k.has(inPlace) {
			continue
		}
		t, err := timeCase(ctx, c, k, inPlace, iters, warmup, cfg.Check)
		if err != nil {
			return res, err
		}
		t.AlgBW = float64(res.SizeBytes) / (t.TimeUS.Median * 1e3)
		t.BusBW = t.AlgBW * k.busFactor(p)
		if inPlace {
			res.InPlace = &t
		} else {
			res.OutOfPlace = &t
		}
	}
	return res, nil
}

// timeCase runs the warm-up and timed iterations of one variant, then the
// checked run, and combines the ranks' figures.
//
// The input is put in place once, before the warm-up, and the iterations
// then run back to back on the same buffers, as nccl-tests, the OSU
// benchmarks and the peers in docs/bench/peers do: an in-place sum grows
// (to infinity, which costs the kernels nothing) but nothing reads it
// until the checked run, which starts from the pristine input again.
// Copying the input back before every timed iteration, as this did until
// 2026-11-26, ran 2 buffers' worth of memory traffic between iterations
// that the peers did not: from 1 MiB up it evicted the shared-memory
// rings from the 1 MiB L2, and gtrain's 1-4 MiB all-reduce took 1.6x
// as long as back to back (docs/benchmarks.md).
func timeCase(ctx context.Context, c *comm.Communicator, k *bcase, inPlace bool, iters, warmup int, check bool) (Timing, error) {
	run := func() error { return k.run(ctx, c, inPlace) }
	k.reset(inPlace)
	// As Go's testing package does before every benchmark: the garbage
	// collection that this size's buffers (or the last size's, now free)
	// set off runs here, not in the timed calls. And the memory the last
	// size's buffers leave free goes back to the system here too
	// (FreeOSMemory collects, then returns it): otherwise the runtime's
	// background scavenger returns it during the next sizes' calls, a
	// millisecond of work at a time (runtime.minScavWorkTime). On a rank
	// with one P (pinned to one core) a waiting pass's runtime.Gosched,
	// or its poll(2) giving up the P, handed the scavenger the P for
	// that millisecond: across two hosts at 10 Gbit/s, reduce-scatter of
	// 64 KiB after the all-reduces of up to 4 MiB had calls of 0.7-1.7
	// ms against a median of 25 µs, the stalled rank's time in one
	// Gosched, its peer's in poll(2) waiting for it (docs/benchmarks.md,
	// "The reduce-scatter stalls were Go's scavenger").
	debug.FreeOSMemory()
	for range warmup {
		if err := run(); err != nil {
			return Timing{}, err
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return Timing{}, err
	}
	times := make([]float32, iters)
	for i := range times {
		t0 := time.Now()
		if err := run(); err != nil {
			return Timing{}, err
		}
		times[i] = float32(time.Since(t0).Seconds() * 1e6)
	}
	// An iteration is done when its slowest rank is.
	if err := c.AllReduce(ctx, comm.F32(times), comm.Max); err != nil {
		return Timing{}, err
	}
	t := Timing{TimeUS: summarize(times), Wrong: -1}
	if check {
		k.reset(inPlace)
		if err := run(); err != nil {
			return Timing{}, err
		}
		wrong := []float32{float32(k.wrong(inPlace))}
		if err := c.AllReduce(ctx, comm.F32(wrong), comm.Sum); err != nil {
			return Timing{}, err
		}
		t.Wrong = int64(wrong[0])
	}
	return t, nil
}

func summarize(us []float32) Stats {
	s := slices.Clone(us)
	slices.Sort(s)
	n := len(s)
	med := float64(s[n/2])
	if n%2 == 0 {
		med = (float64(s[n/2-1]) + float64(s[n/2])) / 2
	}
	sum := 0.0
	for _, v := range s {
		sum += float64(v)
	}
	return Stats{Median: med, Mean: sum / float64(n), Min: float64(s[0]), Max: float64(s[n-1])}
}

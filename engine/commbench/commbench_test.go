package commbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
)

// world connects p in-process ranks.
func world(t *testing.T, p int) []*comm.Communicator {
	t.Helper()
	trs := comm.NewInProc(p)
	cs := make([]*comm.Communicator, p)
	errs := onAll(p, func(r int) (err error) {
		cs[r], err = comm.New(context.Background(), r, p, trs[r], comm.Options{Timeout: 20 * time.Second})
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

func onAll(p int, f func(r int) error) []error {
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// runAll runs cfg on every rank and returns rank 0's results, checking
// that every rank reported the same ones.
func runAll(t *testing.T, cs []*comm.Communicator, cfg Config) []Result {
	t.Helper()
	got := make([][]Result, len(cs))
	errs := onAll(len(cs), func(r int) error {
		return Run(context.Background(), cs[r], cfg, func(res Result) { got[r] = append(got[r], res) })
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := 1; r < len(cs); r++ {
		a, _ := json.Marshal(got[0])
		b, _ := json.Marshal(got[r])
		if !bytes.Equal(a, b) {
			t.Fatalf("rank %d reported other results than rank 0:\n%s\n%s", r, b, a)
		}
	}
	return got[0]
}

// TestEveryCaseChecksClean runs every collective, dtype and op on group
// sizes 1 to 4, at sizes that do and do not divide evenly, and requires
// the correctness check to find nothing wrong.
func TestEveryCaseChecksClean(t *testing.T) {
	for _, p := range []int{1, 2, 3, 4} {
		for _, dt := range []comm.DType{comm.Float32, comm.BFloat16, comm.Float16} {
			for _, op := range []comm.Op{comm.Sum, comm.Avg, comm.Max, comm.Min} {
				t.Run(fmt.Sprintf("p%d/%s/%s", p, DTypeName(dt), op), func(t *testing.T) {
					cs := world(t, p)
					cfg := Config{Collectives: Collectives, DType: dt, Op: op, Root: p - 1,
						MinBytes: 6, MaxBytes: 300 << 10, StepFactor: 7, Iters: 2, Warmup: 1, Check: true}
					res := runAll(t, cs, cfg)
					if want := len(Collectives) * 6; len(res) != want { // 6, 42, 294, 2058, 14406, 100842 bytes
						t.Fatalf("%d results, want %d", len(res), want)
					}
					for _, r := range res {
						for name, v := range map[string]*Timing{"out-of-place": r.OutOfPlace, "in-place": r.InPlace} {
							if v == nil {
								continue
							}
							if v.Wrong != 0 {
								t.Errorf("%s %d bytes %s: %d wrong elements", r.Collective, r.SizeBytes, name, v.Wrong)
							}
							if s := v.TimeUS; !(s.Min > 0 && s.Min <= s.Median && s.Median <= s.Max && s.Min <= s.Mean && s.Mean <= s.Max) {
								t.Errorf("%s %d bytes %s: times %+v", r.Collective, r.SizeBytes, name, s)
							}
						}
						if r.OutOfPlace == nil && r.InPlace == nil {
							t.Errorf("%s: no figures", r.Collective)
						}
					}
				})
			}
		}
	}
}

// TestWrongIsCounted corrupts results and expects the check to see it.
func TestWrongIsCounted(t *testing.T) {
	cs := world(t, 2)
	cfg := Config{DType: comm.Float32, Op: comm.Sum, Check: true}
	ks := make([]*bcase, 2)
	errs := onAll(2, func(r int) error {
		ks[r] = newCase("all_reduce", r, 2, cfg, 1000)
		ks[r].reset(true)
		return ks[r].run(context.Background(), cs[r], true)
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := ks[1].wrong(true); n != 0 {
		t.Fatalf("clean result: %d wrong", n)
	}
	s := ks[1].a.Float32s()
	s[17] += 1
	s[999] = float32(s[999]) * 1.0001
	if n := ks[1].wrong(true); n != 2 {
		t.Fatalf("two corrupted elements: %d wrong", n)
	}
	// A block in the wrong place is caught too: the inputs differ by index.
	copy(s[0:100], s[500:600])
	if n := ks[1].wrong(true); n < 90 {
		t.Fatalf("a misplaced block of 100: only %d wrong", n)
	}
}

func TestBusFactorAndSizes(t *testing.T) {
	cs := world(t, 3)
	cfg := Config{Collectives: []string{"all_reduce", "all_gather", "broadcast"}, DType: comm.Float32, Op: comm.Sum,
		MinBytes: 1000, MaxBytes: 1000, Iters: 3, Warmup: -1}
	for _, r := range runAll(t, cs, cfg) {
		var want float64
		switch r.Collective {
		case "all_reduce":
			want = 4.0 / 3
			if r.Count != 250 || r.SizeBytes != 1000 || r.Root != -1 || r.Op != "sum" {
				t.Errorf("all_reduce: %+v", r)
			}
		case "all_gather":
			want = 2.0 / 3
			if r.Count != 249 || r.SizeBytes != 996 || r.Op != "none" { // rounded to a multiple of 3
				t.Errorf("all_gather: %+v", r)
			}
		case "broadcast":
			want = 1
			if r.Root != 0 || r.OutOfPlace != nil {
				t.Errorf("broadcast: %+v", r)
			}
		}
		v := r.InPlace
		if got := v.BusBW / v.AlgBW; got < want*0.999 || got > want*1.001 {
			t.Errorf("%s: busbw/algbw = %v, want %v", r.Collective, got, want)
		}
		if wantAlg := float64(r.SizeBytes) / (v.TimeUS.Median * 1e3); v.AlgBW != wantAlg {
			t.Errorf("%s: algbw %v, want %v", r.Collective, v.AlgBW, wantAlg)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	cs := world(t, 2)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Collectives: []string{"alltoall"}, DType: comm.Float32, Op: comm.Sum, MinBytes: 8, MaxBytes: 8}, `unknown collective "alltoall"`},
		{Config{DType: comm.Float32, Op: comm.Sum, MinBytes: 64, MaxBytes: 8}, "want 1 <= min <= max"},
		{Config{DType: comm.Float32, Op: comm.Sum, MinBytes: 8, MaxBytes: 64, StepFactor: 1}, "step factor 1"},
		{Config{DType: comm.Float32, Op: comm.Sum, MinBytes: 8, MaxBytes: 8, Root: 2}, "root 2 out of range"},
	} {
		err := Run(context.Background(), cs[0], tc.cfg, func(Result) {})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	tab := NewTable(&b)
	tab.Preamble(Report{WorldSize: 2, Hosts: []string{"a", "a"}, Algorithm: "auto"}, Config{DType: comm.BFloat16, Op: comm.Sum, Warmup: -1})
	tab.Row(Result{Collective: "all_reduce", SizeBytes: 4096, Count: 2048, DType: "bfloat16", Op: "sum", Root: -1,
		InPlace: &Timing{TimeUS: Stats{Median: 5.125, Min: 4.5, Max: 130}, AlgBW: 0.8, BusBW: 0.8, Wrong: 0}})
	out := b.String()
	for _, want := range []string{"2 ranks on 1 host(s) (a)", "iterations auto", "# all_reduce", "out-of-place", "in-place",
		"4096", "2048", "bfloat16", "n/a", "5.12", "4.50", "130", "0.80"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Every data line has the header's width, so the columns line up.
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	data, head := lines[len(lines)-1], lines[len(lines)-3]
	if len(data) != len(head) {
		t.Errorf("data line %d wide, header %d:\n%s\n%s", len(data), len(head), head, data)
	}
}

// TestTimedIterationsRunBackToBack pins what makes the figures comparable
// with nccl-tests and the peers in docs/bench/peers: the input is put in
// place before the warm-up and again before the checked run, never
// between timed iterations. 200 in-place float32 sums grow every element
// past the largest float32 (2^200 times its start), and the checked run
// must still find the result right.
func TestTimedIterationsRunBackToBack(t *testing.T) {
	cs := world(t, 2)
	cfg := Config{DType: comm.Float32, Op: comm.Sum, Check: true}
	for _, name := range []string{"all_reduce", "reduce_scatter", "reduce", "all_gather", "broadcast"} {
		t.Run(name, func(t *testing.T) {
			ks := make([]*bcase, 2)
			tms := make([]Timing, 2)
			errs := onAll(2, func(r int) (err error) {
				ks[r] = newCase(name, r, 2, cfg, 1000)
				tms[r], err = timeCase(context.Background(), cs[r], ks[r], true, 200, 3, true)
				return err
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			for r, k := range ks {
				if k.resets != 2 {
					t.Errorf("rank %d: input reset %d times in 3 warm-up, 200 timed and 1 checked iterations, want 2 (before the warm-up and the check)", r, k.resets)
				}
			}
			if tms[0].Wrong != 0 {
				t.Errorf("%d wrong elements after 200 back-to-back iterations", tms[0].Wrong)
			}
		})
	}
}

// TestSummarize: the median of an even count is the mean of the middle
// two, and the mean is the plain mean, which one slow call moves and the
// median does not.
func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		us   []float32
		want Stats
	}{
		{[]float32{5}, Stats{Median: 5, Mean: 5, Min: 5, Max: 5}},
		{[]float32{3, 1, 2}, Stats{Median: 2, Mean: 2, Min: 1, Max: 3}},
		{[]float32{10, 1, 3, 2}, Stats{Median: 2.5, Mean: 4, Min: 1, Max: 10}},
		{[]float32{1, 1, 1, 1, 96}, Stats{Median: 1, Mean: 20, Min: 1, Max: 96}},
	} {
		in := slices.Clone(tc.us)
		if got := summarize(tc.us); got != tc.want {
			t.Errorf("summarize(%v) = %+v, want %+v", in, got, tc.want)
		}
		if !slices.Equal(tc.us, in) {
			t.Errorf("summarize(%v) reordered its input to %v", in, tc.us)
		}
	}
}

// TestCollectsBeforeTiming: every case runs a full garbage collection
// before its warm-up, as Go's testing package does before a benchmark, so
// that one set off by allocating the case's buffers (or by freeing the
// last case's) does not run in the timed calls: across two hosts such a
// collection made single calls of 1 MiB take 0.4-1.4 ms.
func TestCollectsBeforeTiming(t *testing.T) {
	forced := func() uint64 { return metric("/gc/cycles/forced:gc-cycles") }
	cs := world(t, 2)
	cfg := Config{Collectives: []string{"all_reduce", "all_gather"}, DType: comm.Float32, Op: comm.Sum,
		MinBytes: 1 << 10, MaxBytes: 4 << 10, StepFactor: 2, Iters: 2, Warmup: 1}
	before := forced()
	res := runAll(t, cs, cfg)
	cases := 0
	for _, r := range res {
		if r.InPlace != nil {
			cases++
		}
		if r.OutOfPlace != nil {
			cases++
		}
	}
	// Each rank collects before each case; the ranks share this process.
	if got := forced() - before; cases == 0 || got < uint64(cases) {
		t.Errorf("%d forced collections for %d cases, want at least one per case", got, cases)
	}
}

// TestReturnsFreeMemoryBeforeTiming: the memory a case's predecessors
// left free goes back to the system before the case's calls, not in them,
// where Go's background scavenger would take a millisecond at a time of a
// one-P rank's waits (commbench.go's timeCase).
func TestReturnsFreeMemoryBeforeTiming(t *testing.T) {
	free := func() uint64 { return metric("/memory/classes/heap/free:bytes") }
	cs := world(t, 2)
	cfg := Config{Collectives: []string{"all_reduce"}, DType: comm.Float32, Op: comm.Sum,
		MinBytes: 1 << 10, MaxBytes: 1 << 10, StepFactor: 2, Iters: 2, Warmup: 1}
	// 64 MiB that the next collection frees, as the last size's buffers.
	const garbage = 64 << 20
	func() {
		sink := make([]byte, garbage)
		for i := 0; i < len(sink); i += 4096 {
			sink[i] = 1
		}
		runtime.KeepAlive(sink)
	}()
	runtime.GC()
	if got := free(); got < garbage/2 {
		t.Skipf("the runtime returned the freed memory at once (%d bytes left free): nothing to test", got)
	}
	runAll(t, cs, cfg)
	if got := free(); got > garbage/4 {
		t.Errorf("%d bytes of the heap free but not returned after the case, want under %d", got, garbage/4)
	}
}

// metric reads one of the runtime's uint64 metrics.
func metric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

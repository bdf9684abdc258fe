package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/launch/proto"
)

// stragglerJob is three ranks of 20 steps, each step some 20-40 ms of a
// rank's own work on two idle cores (more under load, for every rank
// alike), one compute thread per rank so that three ranks share two cores
// without oversubscribing them further. No log lines: a log step gathers
// every rank's figures after the step (for metrics.jsonl), and a rank
// stopped there would make the others wait outside any step.
const stragglerJob = `
model: {preset: test}
data: {synthetic: 20000}
batch: {micro_batch: 32, seq: 64}
steps: 20
optim: {warmup_steps: 2}
eval: {every: 0}
checkpoint: {dir: ckpt}
threads: 1
log_every: 0
`

const (
	stragglerRanks = 3
	stragglerSteps = 20
	slowRank       = 2
	// slowStop is how long the slowed rank is stopped, stopsPerStep times
	// a step with slowRun between: each stop far above a step's own work
	// (so factor 3 marks it even if a loaded machine stretched the others'
	// work to 100 ms), a step's stops together far below --hang-timeout
	// (so the hang watch never fires instead), and slowRun far below a
	// step's compute (so the rank cannot finish a step between two stops).
	slowStop     = 400 * time.Millisecond
	stopsPerStep = 2
	slowRun      = 2 * time.Millisecond
)

// stragglerArgs run stragglerJob with the marking at factor 3: a uniform job
// would need one rank doing three times the median's work for 8 steps in a
// row to be marked, which scheduling noise on a loaded machine does not do
// (the ranks' medians stay within 1.5× of each other), while the slowed
// rank does 15 times or more. --bind none lets the kernel balance three
// ranks over two cores instead of pinning two to one core.
var stragglerArgs = []string{"run", "--output", "json", "--nproc-per-node", fmt.Sprint(stragglerRanks),
	"--bind", "none", "--straggler-factor", "3", "--hang-timeout", "60s", "--job", "job.yaml"}

// stragglerRun is what a run of stragglerJob reported.
type stragglerRun struct {
	err        error
	stragglers []proto.Event        // straggler events
	notices    []string             // notice messages
	work       map[int][]float64    // rank → its own work per step (step_ms − comm_wait_ms)
	slowed     int                  // steps in which the slowed rank was stopped
	pid        map[int]int          // rank → pid
	records    map[int]map[int]bool // rank → steps reported
}

// runStragglerJob runs stragglerJob in a new directory. With slow, every
// status record of slowRank (but its last) has throttle stop that rank's
// process: the stops land in the rank's next step, in its compute before
// the step's collectives, so its own work grows by slowStop or more while
// the others wait for it in their collectives.
func runStragglerJob(t *testing.T, ctx context.Context, slow bool) stragglerRun {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(stragglerJob), 0o644); err != nil {
		t.Fatal(err)
	}
	r := stragglerRun{work: map[int][]float64{}, pid: map[int]int{}, records: map[int]map[int]bool{}}
	// The reader never blocks on the throttle: a stalled stdout would stall
	// gtrain's event loop and with it every rank.
	kick := make(chan int, 1)
	stopped := make(chan int)
	go func() { stopped <- throttle(kick) }()
	wait := startEvents(t, ctx, dir, proto.MaxLine, func(ev proto.Event) {
		r.add(ev)
		if slow && ev.Type == proto.EventStatus && ev.Rank == slowRank && !r.records[slowRank][stragglerSteps] {
			select {
			case kick <- r.pid[slowRank]:
			default: // one step's stops are already due
			}
		}
	}, stragglerArgs...)
	r.err = wait()
	close(kick)
	r.slowed = <-stopped
	return r
}

// throttle, for each pid it is given, stops it stopsPerStep times for
// slowStop, letting it run for slowRun in between, and returns for how
// many pids it did. The waits are the slowing itself, not a synchronisation.
// More than one stop because the first may find the rank not yet in its
// next step (on a busy machine it can be descheduled right after writing
// its record): it is then outside every step's time, and only a later
// stop, in the step's compute, makes its own work grow.
func throttle(pids <-chan int) int {
	n := 0
	for pid := range pids {
		for i := range stopsPerStep {
			if i > 0 {
				time.Sleep(slowRun)
			}
			if pid <= 0 || syscall.Kill(pid, syscall.SIGSTOP) != nil {
				break
			}
			time.Sleep(slowStop)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			if i == 0 {
				n++
			}
		}
	}
	return n
}

// add records one event of the run.
func (r *stragglerRun) add(ev proto.Event) {
	switch ev.Type {
	case proto.EventRankStarted:
		r.pid[ev.Rank] = ev.PID
	case proto.EventStraggler, proto.EventStragglerEnd:
		r.stragglers = append(r.stragglers, ev)
	case proto.EventNotice:
		r.notices = append(r.notices, ev.Message)
	case proto.EventStatus:
		var rec train.Record
		if json.Unmarshal(ev.Status, &rec) != nil {
			return
		}
		if r.records[ev.Rank] == nil {
			r.records[ev.Rank] = map[int]bool{}
		}
		r.records[ev.Rank][rec.Step] = true
		r.work[ev.Rank] = append(r.work[ev.Rank], rec.StepMillis-rec.WaitMillis)
	}
}

// checkComplete fails unless the run exited 0 with every step of every
// rank reported: the marking judged the whole job, not a part of it.
func (r *stragglerRun) checkComplete(t *testing.T) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("gtrain run: %v", r.err)
	}
	for rank := range stragglerRanks {
		if n := len(r.records[rank]); n != stragglerSteps {
			t.Fatalf("rank %d reported %d steps, want %d", rank, n, stragglerSteps)
		}
	}
	for rank := range stragglerRanks {
		w := slices.Clone(r.work[rank])
		slices.Sort(w)
		t.Logf("rank %d: own work per step: median %.1f ms, max %.1f ms", rank, w[len(w)/2], w[len(w)-1])
	}
}

// summaries are the notices of the job summary that name a straggler.
func (r *stragglerRun) summaries() []string {
	var out []string
	for _, m := range r.notices {
		if strings.HasPrefix(m, "summary: ") && strings.Contains(m, "was a straggler") {
			out = append(out, m)
		}
	}
	return out
}

// TestStragglerRealJob runs a real three-rank built-in engine job twice:
// uniform, nobody is marked; with rank 2 stopped (SIGSTOP) in every step, exactly rank 2 is marked, in a straggler event naming it and
// its host, and in the job summary.
func TestStragglerRealJob(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two real engine jobs (about 20 s)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	t.Run("uniform", func(t *testing.T) {
		r := runStragglerJob(t, ctx, false)
		r.checkComplete(t)
		if len(r.stragglers) != 0 || len(r.summaries()) != 0 {
			t.Errorf("a uniform job was marked: events %+v, summary %q", r.stragglers, r.summaries())
		}
	})

	t.Run("one rank slowed", func(t *testing.T) {
		r := runStragglerJob(t, ctx, true)
		r.checkComplete(t)
		// A window of the marking holds 8 steps: fewer stops cannot mark.
		if r.slowed < 8 {
			t.Fatalf("rank %d was stopped in %d steps, want at least 8", slowRank, r.slowed)
		}
		marked := false
		for _, ev := range r.stragglers {
			if ev.Rank != slowRank {
				t.Errorf("rank %d (host %s) was marked (%s: %s); only rank %d was slowed", ev.Rank, ev.Host, ev.Type, ev.Message, slowRank)
				continue
			}
			if ev.Type == proto.EventStraggler {
				marked = true
				if ev.Host != "localhost" || !strings.Contains(ev.Message, "--straggler-factor 3") {
					t.Errorf("straggler event: host %q, message %q; want host localhost and why, naming --straggler-factor 3", ev.Host, ev.Message)
				}
			}
		}
		if !marked {
			t.Errorf("rank %d, stopped %d×%v in each of %d steps, was never marked", slowRank, stopsPerStep, slowStop, r.slowed)
		}
		want := fmt.Sprintf("summary: rank %d (host localhost) was a straggler: ", slowRank)
		if sum := r.summaries(); len(sum) != 1 || !strings.HasPrefix(sum[0], want) {
			t.Errorf("job summary %q, want one line starting %q", sum, want)
		}
	})
}

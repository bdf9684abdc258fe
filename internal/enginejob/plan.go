package enginejob

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/planner"
)

// PlanOptions say how Job.Planner lays the job out for each attempt.
type PlanOptions struct {
	// Auto re-plans tp, pp, dp and the batch split with the planner on the
	// hosts' reported facts (run --auto on a hostfile's hosts).
	Auto bool
	// Line is --auto's line for a layout chosen from the hosts' facts,
	// shown as a note; nil shows none.
	Line func(train.AutoChoice) string
	// Layout, when set, is told the spec every rank of each attempt runs
	// once the attempt is planned, dp resolved for its world (a job's
	// dp 0 is every replica): what gtrain_job_info names.
	Layout func(train.Spec)
	// Speed is the engine's speed per core the plans from facts assume;
	// nil: this machine's, measured once at the first such plan
	// (train.MeasureCPU, as --auto's first layout measures it).
	Speed *planner.CPUSpeed
}

// Planner is the launcher's planning hook (launch.Runtime.Plan) for j:
// once every host of an attempt has joined, it gives every rank the spec
// laid out for that attempt's world. The global batch is the one of the
// first attempt's world and stays, so an elastic restart on fewer or more
// hosts trains on as the uninterrupted job would: dp is recomputed from
// the layout the last attempt ran (train.Refit), or with o.Auto the whole
// layout re-planned for the hosts that joined (train.AutoLayoutOn), both
// keeping its gradient accumulation where they can (the data order stays
// the uninterrupted run's). Attempts on the job's own world without
// o.Auto keep the spec the ranks already have.
func (j *Job) Planner(o PlanOptions) func(context.Context, launch.World) (launch.Planned, error) {
	pl := &attemptPlanner{job: j, o: o, cur: j.Spec, speed: o.Speed}
	return pl.carried // plan, with its state carried between nodes (pernode.go)
}

// attemptPlanner is Planner's state across attempts; the launcher asks it for
// one attempt at a time.
type attemptPlanner struct {
	job    *Job
	o      PlanOptions
	cur    train.Spec // the layout the last attempt ran
	global int        // sequences per step, fixed by the first attempt
	first  int        // the first attempt's ranks
	speed  *planner.CPUSpeed
}

func (p *attemptPlanner) plan(_ context.Context, w launch.World) (launch.Planned, error) {
	var out launch.Planned
	if p.global == 0 {
		g, err := train.GlobalBatch(p.job.Spec, w.Size)
		if err != nil {
			return out, err
		}
		p.global, p.first = g, w.Size
	}
	spec, err := p.specFor(w, &out.Notes)
	if err != nil {
		return out, err
	}
	if spec == nil {
		p.told(p.cur, w.Size)
		return out, nil
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return out, fmt.Errorf("run: encode the job for attempt %d: %w", w.Attempt, err)
	}
	if b := p.cur.Batch; w.Attempt > 0 && b.GradAccum != spec.Batch.GradAccum {
		out.Notes = append(out.Notes, fmt.Sprintf("attempt %d changes grad_accum %d → %d (no layout with %d fits): its steps see other data than an uninterrupted run's",
			w.Attempt, b.GradAccum, spec.Batch.GradAccum, b.GradAccum))
	}
	p.cur = *spec
	out.Env = []string{rankenv.JobSpec + "=" + string(js)}
	p.told(*spec, w.Size)
	return out, nil
}

// told tells PlanOptions.Layout the spec an attempt of world ranks runs.
func (p *attemptPlanner) told(spec train.Spec, world int) {
	if p.o.Layout != nil {
		p.o.Layout(ResolveDP(spec, world))
	}
}

// ResolveDP is spec with dp resolved as the engine resolves it on world
// ranks (train.FitDP): dp 0 is every replica of tp × pp, and a
// checkpoint's dp of another world is resharded, the micro-batch rescaled
// to keep the global batch, as a resume on other hosts does. A world the
// engine refuses leaves spec as it is.
func ResolveDP(spec train.Spec, world int) train.Spec {
	if s, err := train.FitDP(spec, world); err == nil {
		return s
	}
	return spec
}

// specFor is the spec laid out for the world w, or nil where the ranks'
// spec stands as it is; it adds what the user should know to notes.
func (p *attemptPlanner) specFor(w launch.World, notes *[]string) (*train.Spec, error) {
	if p.o.Auto {
		if hosts, ok := reported(w.Facts); ok {
			return p.autoSpec(w, hosts, notes)
		}
	}
	if w.Attempt == 0 && p.ownGlobal(w.Size) {
		return nil, nil
	}
	spec, err := train.Refit(p.cur, w.Size, p.global)
	if err != nil {
		return nil, err
	}
	q := spec.Parallel
	*notes = append(*notes, fmt.Sprintf("attempt %d runs on %d ranks: tp %d × pp %d × dp %d, micro_batch %d × grad_accum %d, the global batch stays %d sequences",
		w.Attempt, w.Size, max(q.TP, 1), max(q.PP, 1), q.DP, spec.Batch.MicroBatch, spec.Batch.GradAccum, p.global))
	return &spec, nil
}

// ownGlobal says whether the job's own spec trains the planned global
// batch on world ranks, so that a first attempt runs it as it is: a
// fresh job's first world always does; a job resumed on another world
// (resumeGlobal) may not.
func (p *attemptPlanner) ownGlobal(world int) bool {
	g, err := train.GlobalBatch(p.job.Spec, world)
	return err == nil && g == p.global
}

// autoSpec is the spec laid out for w from what its hosts reported
// (--auto on a hostfile's hosts). The notes say first which memory and
// CPUs each host reported, the figures the plan rests on, so that a
// refusal too shows which host was short, then the planner's warnings and
// the layout.
func (p *attemptPlanner) autoSpec(w launch.World, hosts []hostinfo.Host, notes *[]string) (*train.Spec, error) {
	*notes = append(*notes, reportedNote(w, hosts))
	top, warns, err := planner.CPUTopologyWith(hosts, w.Slots, p.figures(w))
	*notes = append(*notes, warns...)
	if err != nil {
		return nil, fmt.Errorf("run --auto: the hosts' reported facts: %w", err)
	}
	accum := 0
	if w.Attempt > 0 {
		accum = p.cur.Batch.GradAccum
	}
	spec, choice, err := train.AutoLayoutOn(p.job.Spec, top, p.global, accum)
	if err != nil {
		name, mem := leastMemory(w, hosts)
		return nil, fmt.Errorf("%w (every host planned with the least memory reported: %s on %s)", err, sizeText(mem), name)
	}
	if p.o.Line != nil {
		*notes = append(*notes, "from the hosts' reported facts: "+p.o.Line(choice))
	}
	return &spec, nil
}

// reportedNote names the memory and CPUs each host of w reported, as the
// planner counts them (planner.HostMemory, HostCPUs).
func reportedNote(w launch.World, hosts []hostinfo.Host) string {
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		mem := planner.HostMemory(h)
		from := ""
		if c := h.Cgroup.MemoryBytes; c > 0 && c == mem {
			from = " (its cgroup's limit)"
		}
		parts[i] = fmt.Sprintf("%s %s%s and %d CPUs", hostName(w, i, h), sizeText(mem), from, planner.HostCPUs(h))
	}
	return "--auto: the hosts reported " + strings.Join(parts, "; ")
}

// leastMemory is the host of w that reported the least memory, and that
// memory: the one every host is planned with.
func leastMemory(w launch.World, hosts []hostinfo.Host) (string, int64) {
	least := 0
	for i, h := range hosts {
		if planner.HostMemory(h) < planner.HostMemory(hosts[least]) {
			least = i
		}
	}
	return hostName(w, least, hosts[least]), planner.HostMemory(hosts[least])
}

// hostName is node i of w as the hostfile names it, else as it named
// itself.
func hostName(w launch.World, i int, h hostinfo.Host) string {
	if i < len(w.Hosts) && w.Hosts[i].Name != "" {
		return w.Hosts[i].Name
	}
	return h.Name
}

// sizeText is b bytes in MiB below a GiB, else in GiB.
func sizeText(b int64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

// figures are what the planner is told of w's ranks besides the hosts'
// facts: the engine's speed per core, and the CPUs --bind gives each rank
// (their threads), where it binds them.
func (p *attemptPlanner) figures(w launch.World) planner.CPUFigures {
	if p.speed == nil {
		s := train.MeasureCPU()
		p.speed = &s
	}
	return planner.CPUFigures{Speed: *p.speed, RankCPUs: w.RankCPUs()}
}

// reported is the hosts' facts when every agent reported some.
func reported(facts []*hostinfo.Host) ([]hostinfo.Host, bool) {
	if len(facts) == 0 || slices.Contains(facts, nil) {
		return nil, false
	}
	hosts := make([]hostinfo.Host, len(facts))
	for i, h := range facts {
		hosts[i] = *h
	}
	return hosts, true
}

package enginejob

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/launch"
)

// plannedSpec is the spec a plan gives the ranks; ok is false when it
// gives none (the ranks keep the job's).
func plannedSpec(t *testing.T, pl launch.Planned) (spec train.Spec, ok bool) {
	t.Helper()
	for _, kv := range pl.Env {
		if js, found := strings.CutPrefix(kv, rankenv.JobSpec+"="); found {
			if err := json.Unmarshal([]byte(js), &spec); err != nil {
				t.Fatal(err)
			}
			return spec, true
		}
	}
	return spec, false
}

// host is a detected host with mem bytes and cpus CPUs.
func host(name string, mem int64, cpus int) *hostinfo.Host {
	return &hostinfo.Host{Name: name, CPU: hostinfo.CPU{Threads: cpus},
		NUMA: []hostinfo.NUMANode{{ID: 0, MemoryBytes: mem}}}
}

// world is an attempt of n hosts with one rank each.
func world(attempt int, facts ...*hostinfo.Host) launch.World {
	w := launch.World{Attempt: attempt, Size: len(facts), Facts: facts}
	for range facts {
		w.Slots = append(w.Slots, 1)
	}
	return w
}

// TestPlannerKeepsGlobalBatch: the first attempt's world fixes the global
// batch; its ranks keep the job's spec; a restart on fewer ranks gets the
// spec refit to them with that global batch, and a note saying so.
func TestPlannerKeepsGlobalBatch(t *testing.T) {
	j := &Job{Spec: train.DefaultSpec()}
	j.Spec.Batch.MicroBatch, j.Spec.Batch.GradAccum = 2, 2 // dp 0: every rank
	plan := j.Planner(PlanOptions{})
	pl, err := plan(t.Context(), world(0, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plannedSpec(t, pl); ok {
		t.Errorf("attempt 0 on the job's world got a new spec: %v", pl.Env)
	}
	pl, err = plan(t.Context(), world(1, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	spec, ok := plannedSpec(t, pl)
	if b, p := spec.Batch, spec.Parallel; !ok || p.DP != 2 || b.MicroBatch*b.GradAccum*p.DP != 12 {
		t.Fatalf("attempt 1 on 2 ranks: spec given %v, micro_batch %d × grad_accum %d × dp %d; want dp 2 and the global batch of 12", ok, b.MicroBatch, b.GradAccum, p.DP)
	}
	if len(pl.Notes) != 1 || !strings.Contains(pl.Notes[0], "the global batch stays 12 sequences") {
		t.Errorf("notes %q, want one saying the global batch stays", pl.Notes)
	}
}

// TestPlannerAutoFromFacts: with --auto the plan comes from what the hosts
// reported: a host that reports less memory changes it (the weakest is
// planned for, with the planner's warning), and the global batch stays.
func TestPlannerAutoFromFacts(t *testing.T) {
	spec := train.DefaultSpec()
	spec.Model.Preset = "gpt2"
	spec.Batch.MicroBatch, spec.Batch.GradAccum = 8, 1
	j := &Job{Spec: spec}
	line := func(c train.AutoChoice) string { return "chosen" }
	const big = 64 << 30
	plans := map[string]train.Spec{}
	for name, facts := range map[string][]*hostinfo.Host{
		"equal": {host("a", big, 8), host("b", big, 8)},
		"small": {host("a", big, 8), host("b", 3<<30, 8)},
	} {
		pl, err := j.Planner(PlanOptions{Auto: true, Line: line})(t.Context(), world(0, facts...))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, ok := plannedSpec(t, pl)
		if b, p := got.Batch, got.Parallel; !ok || b.MicroBatch*b.GradAccum*p.DP != 16 {
			t.Fatalf("%s: spec given %v, micro_batch %d × grad_accum %d × dp %d, want the global batch of 16", name, ok, b.MicroBatch, b.GradAccum, p.DP)
		}
		warned := strings.Contains(strings.Join(pl.Notes, "\n"), "hosts differ in memory")
		if warned != (name == "small") || !strings.Contains(strings.Join(pl.Notes, "\n"), "from the hosts' reported facts: chosen") {
			t.Errorf("%s: notes %q", name, pl.Notes)
		}
		plans[name] = got
	}
	eq, sm := plans["equal"], plans["small"]
	ep, sp := eq.Parallel, sm.Parallel
	if eq.Batch == sm.Batch && ep.TP == sp.TP && ep.PP == sp.PP && ep.ZeroStage == sp.ZeroStage && eq.Recompute == sm.Recompute {
		t.Errorf("a host with 3 GiB got the plan of 64 GiB hosts: %+v %+v", sm.Batch, sm.Parallel)
	}
}

// TestPlannerAutoNamesReportedMemory: --auto's plan from the hosts' facts
// says which memory and CPUs each host reported (a cgroup's limit named as
// such), and a refusal names the host with the least memory and that
// memory, which every host was planned with.
func TestPlannerAutoNamesReportedMemory(t *testing.T) {
	spec := train.DefaultSpec()
	spec.Model.Preset = "gpt2"
	spec.Batch.MicroBatch, spec.Batch.GradAccum = 8, 1
	j := &Job{Spec: spec}
	limited := func(mem int64) *hostinfo.Host {
		h := host("b", 64<<30, 8)
		h.Cgroup.MemoryBytes = mem
		return h
	}
	w := world(0, host("a", 64<<30, 8), limited(3<<30))
	w.Hosts = []launch.Host{{Name: "10.0.0.10"}, {Name: "10.0.0.11"}}
	pl, err := j.Planner(PlanOptions{Auto: true})(t.Context(), w)
	notes := strings.Join(pl.Notes, "\n")
	if err != nil || !strings.Contains(notes, "--auto: the hosts reported 10.0.0.10 64.0 GiB and 8 CPUs; 10.0.0.11 3.0 GiB (its cgroup's limit) and 8 CPUs") {
		t.Errorf("3 GiB host: %v; notes %q: want each host's memory and CPUs", err, notes)
	}
	w.Facts[1] = limited(64 << 20)
	pl, err = j.Planner(PlanOptions{Auto: true})(t.Context(), w)
	if err == nil || !strings.Contains(err.Error(), "no layout of the job fits") ||
		!strings.Contains(err.Error(), "every host planned with the least memory reported: 64.0 MiB on 10.0.0.11") {
		t.Errorf("64 MiB host: %v: want a refusal naming 10.0.0.11 and its 64.0 MiB", err)
	}
	if notes := strings.Join(pl.Notes, "\n"); !strings.Contains(notes, "10.0.0.11 64.0 MiB (its cgroup's limit)") || !strings.Contains(notes, "hosts differ in memory") {
		t.Errorf("64 MiB host: notes %q: want what each host reported and the planner's warning, before the refusal", notes)
	}
}

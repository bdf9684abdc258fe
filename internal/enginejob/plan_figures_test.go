package enginejob

import (
	"testing"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/planner"
)

// smtFacts is a reported host of one NUMA node of 6 cores × 2 threads
// (CPUs 0-5 and their siblings 6-11) and 64 GiB.
func smtFacts(name string) *hostinfo.Host {
	cpus := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	h := &hostinfo.Host{Name: name, CPU: hostinfo.CPU{Sockets: 1, Cores: 6, Threads: 12, Online: cpus},
		NUMA: []hostinfo.NUMANode{{ID: 0, CPUs: cpus, MemoryBytes: 64 << 30}}}
	for c := range 6 {
		h.CPU.Siblings = append(h.CPU.Siblings, []int{c, c + 6})
	}
	return h
}

// TestPlannerFigures: --auto's plans from the hosts' facts assume the
// speed they are given, else this machine's measured once, and the CPUs
// --bind gives each rank rather than the host's CPUs ÷ its ranks.
func TestPlannerFigures(t *testing.T) {
	w := launch.World{Hosts: []launch.Host{{Name: "a", Slots: []int{0, 1, 2, 3}}, {Name: "b", Slots: []int{0, 1, 2, 3}}},
		Facts: []*hostinfo.Host{smtFacts("a"), smtFacts("b")}, Size: 8, Slots: []int{4, 4}, Bind: launch.BindCore}
	given := planner.CPUSpeed{GEMMFLOPSPerCore: 1e9}
	p := &attemptPlanner{job: &Job{Spec: train.DefaultSpec()}, speed: &given}
	// 6 cores among 4 ranks, whole cores each: 1, 2, 1 and 2 cores, 2
	// threads for the fewest, where 12 CPUs ÷ 4 ranks would give 3.
	if f := p.figures(w); f.Speed != given || f.RankCPUs != 2 {
		t.Errorf("figures %+v: want the given speed and 2 CPUs a rank", f)
	}
	w.Bind = launch.BindNone
	if f := p.figures(w); f.RankCPUs != 0 {
		t.Errorf("figures %+v unbound: want no per-rank CPUs", f)
	}
	m := &attemptPlanner{job: &Job{Spec: train.DefaultSpec()}}
	first := m.figures(w)
	if !(first.Speed.GEMMFLOPSPerCore > 0) || m.speed == nil || m.figures(w).Speed != first.Speed {
		t.Errorf("speed %+v: want this machine's, measured once and kept", first.Speed)
	}
}

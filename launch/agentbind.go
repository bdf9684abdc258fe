package launch

import (
	"context"
	"slices"
	"strings"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/launch/detect"
)

// DetectHost detects the hardware of the host an agent runs on, for its
// joined event and its ranks' binding (a variable, so that tests can
// describe another host).
var DetectHost = func(ctx context.Context) *hostinfo.Host {
	h := detect.Local(ctx)
	return &h
}

// PlanHostBinding is PlanBinding for ranks started by a process on host h
// (named name in messages): within the CPUs that process may itself use,
// as mpirun and srun keep within a job's allocation (taskset, a Slurm
// step's cpuset).
func PlanHostBinding(h *hostinfo.Host, name string, mode BindMode, slots []int) ([]Binding, error) {
	local := *h
	local.Name = name
	if own := processAffinity(); len(own) > 0 {
		if cpus := intersect(usableCPUs(h), own); len(cpus) > 0 {
			local.Cgroup.CPUSet = cpus
		}
	}
	return PlanBinding(&local, mode, slots)
}

// planBinds plans the binding of every rank of the assignment on host h,
// keyed by local rank; an assignment without a bind mode binds nothing.
func (a *agent) planBinds(h *hostinfo.Host) error {
	if a.asg.Bind == "" || h == nil {
		return nil
	}
	mode, err := ParseBindMode(a.asg.Bind)
	if err != nil {
		return err
	}
	slots := make([]int, len(a.asg.Ranks))
	for i, r := range a.asg.Ranks {
		slots[i] = r.Slot
	}
	bs, err := PlanHostBinding(h, a.asg.Host, mode, slots)
	if err != nil {
		return err
	}
	a.binds = make(map[int]*Binding, len(bs))
	for i, r := range a.asg.Ranks {
		a.binds[r.LocalRank] = &bs[i]
	}
	return nil
}

// withDefaults adds to env the entries of defaults whose variable env
// does not set: a binding never overrides what the user (or the host)
// chose.
func withDefaults(env []string, defaults map[string]string) []string {
	if len(defaults) == 0 {
		return env
	}
	set := make(map[string]bool, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	for _, k := range sortedKeys(defaults) {
		if !set[k] {
			env = append(env, k+"="+defaults[k])
		}
	}
	return env
}

// sortedKeys is m's keys in order, so environments come out the same
// every time.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

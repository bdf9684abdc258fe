package launch

// RankCPUs is the fewest CPUs a rank of w computes on under the job's
// --bind (Binding.Threads, its GTRAIN_CPUS), as each host's agent plans it
// from the facts the host reported: what the built-in engine gives the
// rank as threads, for the planner (planner.CPUFigures.RankCPUs). 0 when
// the ranks are not bound, a host reported no facts, or its binding cannot
// be planned (its agent says why when it starts).
func (w World) RankCPUs() int {
	if w.Bind == "" || w.Bind == BindNone || len(w.Facts) != len(w.Hosts) {
		return 0
	}
	fewest := 0
	for i, h := range w.Hosts {
		if w.Facts[i] == nil || len(h.Slots) == 0 {
			return 0
		}
		bs, err := PlanBinding(w.Facts[i], w.Bind, h.Slots)
		if err != nil {
			return 0
		}
		for _, b := range bs {
			if len(b.CPUs) == 0 {
				return 0 // unbound after all (no CPU list to keep to)
			}
			if fewest == 0 || b.Threads < fewest {
				fewest = b.Threads
			}
		}
	}
	return fewest
}

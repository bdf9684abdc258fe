package launch

import (
	"fmt"
	"slices"
)

// DefaultStragglerFactor is --straggler-factor's default: a rank whose own
// work per step stays above 1.5 times the job's median is marked.
const DefaultStragglerFactor = 1.5

// stragglerMinMillis is how much slower than the median a straggler must
// also be, in ms: on steps of a few milliseconds a busy machine's
// scheduling noise alone is of that order.
const stragglerMinMillis = 20

// stragglerWindow is how many recent steps of each rank are weighed: the
// median over them ignores a single slow step (a checkpoint, a page fault).
const stragglerWindow = 8

// stragglers finds ranks slower than the rest. Every rank of a
// synchronous job takes as long per step (the others wait for the slowest
// in the collectives), so a rank is weighed by its own work: its step time
// less the time it was blocked in collectives (step_ms − comm_wait_ms in
// the built-in engine's records; step_ms alone where a program reports no
// wait). Not safe for concurrent use: the attempt's loop owns it.
type stragglers struct {
	factor  float64 // ≤ 1: off
	ranks   int     // ranks of the job: all must report before any is judged
	work    map[int][]float64
	flagged map[int]string // rank → why, while it is a straggler
	ever    map[int]string // rank → why, the last time it was flagged
}

func newStragglers(factor float64, ranks int) *stragglers {
	return &stragglers{factor: factor, ranks: ranks, work: map[int][]float64{}, flagged: map[int]string{}, ever: map[int]string{}}
}

// stragglerChange is a rank that became a straggler (why set) or stopped
// being one.
type stragglerChange struct {
	rank int
	why  string
}

// observe takes one step's work (ms) of rank and returns the ranks whose
// mark changed.
func (s *stragglers) observe(rank int, work float64) []stragglerChange {
	if s.factor <= 1 || work < 0 {
		return nil
	}
	w := append(s.work[rank], work)
	if len(w) > stragglerWindow {
		w = w[len(w)-stragglerWindow:]
	}
	s.work[rank] = w
	medians := map[int]float64{}
	for r, w := range s.work {
		if len(w) < stragglerWindow {
			return nil
		}
		medians[r] = median(w)
	}
	if len(medians) < s.ranks || len(medians) < 2 {
		return nil
	}
	all := make([]float64, 0, len(medians))
	for _, m := range medians {
		all = append(all, m)
	}
	job := median(all)
	if job <= 0 {
		return nil
	}
	return s.judge(medians, job)
}

// judge marks and unmarks ranks by their median against the job's.
func (s *stragglers) judge(medians map[int]float64, job float64) []stragglerChange {
	var out []stragglerChange
	for _, r := range sortedRanks(medians) {
		m := medians[r]
		slow := m > s.factor*job && m-job >= stragglerMinMillis
		_, was := s.flagged[r]
		switch {
		case slow && !was:
			why := fmt.Sprintf("its own work per step (step time less time waiting for others) is %.1f ms, %.1f× the job's median %.1f ms over the last %d steps (--straggler-factor %g)",
				m, m/job, job, stragglerWindow, s.factor)
			s.flagged[r], s.ever[r] = why, why
			out = append(out, stragglerChange{rank: r, why: why})
		case !slow && was:
			delete(s.flagged, r)
			out = append(out, stragglerChange{rank: r})
		}
	}
	return out
}

// summary returns the ranks ever marked, with why, in rank order.
func (s *stragglers) summary() []stragglerChange {
	var out []stragglerChange
	for _, r := range sortedRanks(s.ever) {
		out = append(out, stragglerChange{rank: r, why: s.ever[r]})
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func sortedRanks[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

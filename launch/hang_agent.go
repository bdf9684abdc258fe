package launch

import (
	"slices"
	"syscall"
)

// signalRanks sends sig to the process of each of ranks still running on
// this host (the process only, not its group: the dump signal is for the
// rank, and its children may not handle it).
func (a *agent) signalRanks(ranks []int, sig syscall.Signal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, rp := range a.ranks {
		if rp.pid > 0 && !rp.exited.Load() && slices.Contains(ranks, rp.asg.Rank) {
			_ = syscall.Kill(rp.pid, sig)
		}
	}
}

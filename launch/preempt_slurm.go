package launch

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/gtrain/gtrain/launch/proto"
)

// preemptedRank handles a rank that exited ExitResumable before the
// launcher stopped anything: a scheduler signalled the ranks or their
// agents rather than the launcher (scancel --signal=USR1, sbatch
// --signal=USR1@90 without "B:", which Slurm delivers to every process of
// the job's steps; the agent forwards it, so the exit counts as killed).
// That is the job's preemption, neither a failure nor a success: the first such exit stops the other ranks
// with SIGUSR1, as the launcher's own SIGUSR1 would, so that every rank
// saves (a SIGTERM for a failure would interrupt the saves under way),
// and the job ends resumable when all have. It reports whether ev was
// such an exit.
func (a *attempt) preemptedRank(ev proto.Event) bool {
	if ev.Code != ExitResumable {
		return false
	}
	if a.failure == nil {
		a.fail(&InterruptedError{Signal: syscall.SIGUSR1},
			fmt.Sprintf("rank %d stopped and can resume: a preemption signal reached the ranks", ev.Rank))
		return true
	}
	var ie *InterruptedError
	return errors.As(a.failure, &ie) && ie.Preemption()
}

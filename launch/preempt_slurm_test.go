package launch

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestRankPreemptedBySlurm: a preemption signal that reached the ranks and
// not the launcher (scancel --signal=USR1 to the job's steps) makes a rank
// exit 75; the launcher then stops the others with SIGUSR1, not SIGTERM,
// and the job ends resumable.
func TestRankPreemptedBySlurm(t *testing.T) {
	dir := t.TempDir()
	// Rank 1 saves (exits 75) on SIGUSR1 and fails on SIGTERM; rank 0
	// stops resumable once rank 1 is ready, as if signalled first.
	script := `if [ "$RANK" = 1 ]; then trap 'exit 75' USR1; trap 'exit 1' TERM; touch ` + dir + `/ready
while :; do sleep 0.05; done; fi
while [ ! -e ` + dir + `/ready ]; do sleep 0.05; done; exit 75`
	_, err := runJob(t, t.Context(), 2, 30*time.Second, script)
	var re *ResumableError
	if !errors.As(err, &re) || re.Signal != syscall.SIGUSR1 {
		t.Fatalf("Run error = %v, want a *ResumableError for SIGUSR1", err)
	}
}

// TestAgentPreemptedBySlurm: the scheduler signals the agent (a job step
// under srun), which stops its ranks itself; ranks that save (exit 75)
// end the job resumable, not successful.
func TestAgentPreemptedBySlurm(t *testing.T) {
	dir := t.TempDir()
	// Both ranks save on SIGTERM, and on SIGUSR1 as gtrain's worker does:
	// once the first rank has exited 75 the launcher stops the others with
	// SIGUSR1, which on a loaded machine can reach a rank before its
	// agent's SIGTERM has (sh runs a trap only after its sleep). Rank 0
	// signals their agent (its parent) once both are ready.
	script := `trap 'exit 75' TERM USR1; touch ` + dir + `/ready.$RANK
if [ "$RANK" = 0 ]; then while [ ! -e ` + dir + `/ready.1 ]; do sleep 0.05; done; kill -TERM $PPID; fi
while :; do sleep 0.05; done`
	_, err := runJob(t, t.Context(), 2, 30*time.Second, script)
	var re *ResumableError
	if !errors.As(err, &re) {
		t.Fatalf("Run error = %v, want a *ResumableError", err)
	}
}

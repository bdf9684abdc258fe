package launch

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// RankFailedError is the rank of a job that ended badly on its own (not
// killed by gtrain's teardown) and most likely caused the job's failure:
// see rootCause. gtrain exits with its Code.
type RankFailedError struct {
	Host      string
	Node      int
	Rank      int
	LocalRank int
	PID       int
	Code      int       // exit code, 128+n when killed by signal n
	Signal    string    // the signal's name when a signal ended it
	Message   string    // from TORCHELASTIC_ERROR_FILE, if the rank wrote one
	LastLines []string  // its last lines of output
	Time      time.Time // when it exited (the agent's clock)
	// PeerFailed says the rank failed because a peer died (its error file
	// said so): it is reported after the ranks that failed on their own.
	PeerFailed bool
	// AlsoFailed names, briefly, the other failures of the same attempt.
	AlsoFailed []string
}

func (e *RankFailedError) Error() string {
	how := fmt.Sprintf("exited with code %d", e.Code)
	if e.Signal != "" {
		how = fmt.Sprintf("was killed by %s", e.Signal)
	}
	if e.Code == 127 && e.PID == 0 {
		how = "could not start"
	}
	s := fmt.Sprintf("launch: rank %d (local rank %d) on %s %s", e.Rank, e.LocalRank, e.Host, how)
	if e.Message != "" {
		s += ": " + firstLine(e.Message)
	}
	return s
}

// short is the rank and how it ended, for lists of other failures.
func (e *RankFailedError) short() string {
	s := fmt.Sprintf("rank %d on %s ", e.Rank, e.Host)
	switch {
	case e.Code == 127 && e.PID == 0:
		return s + "could not start"
	case e.Signal != "":
		return s + "was killed by " + e.Signal
	case e.PeerFailed:
		return s + fmt.Sprintf("exited with code %d (its peer was gone)", e.Code)
	}
	return s + fmt.Sprintf("exited with code %d", e.Code)
}

// Report is the multi-line account printed when the job fails: the error,
// the rank's last lines of output, and the other failures of the attempt.
func (e *RankFailedError) Report() string {
	var b strings.Builder
	b.WriteString(e.Error())
	if len(e.LastLines) > 0 {
		fmt.Fprintf(&b, "\nlast %d line(s) of rank %d:", len(e.LastLines), e.Rank)
		for _, l := range e.LastLines {
			b.WriteString("\n  | " + l)
		}
	}
	if len(e.AlsoFailed) > 0 {
		b.WriteString("\nalso failed: " + strings.Join(e.AlsoFailed, "; "))
	}
	return b.String()
}

// InterruptedError means gtrain itself was signalled (Ctrl-C, SIGTERM) and
// stopped what it was doing; Run reports it as "launch: interrupted by
// SIGINT: job stopped". gtrain exits with 128 + the signal number, like a
// shell.
type InterruptedError struct{ Signal os.Signal }

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("interrupted by %s", signalName(e.Signal))
}

// jobStopped is an interruption of a running job, as Run reports it.
func jobStopped(cause error) error {
	return fmt.Errorf("launch: %w: job stopped", cause)
}

// Preemption reports whether the signal asks the job to stop and save rather
// than to die: SIGTERM (what schedulers send first) or SIGUSR1 (Slurm's
// --signal=USR1@…). The ranks are sent the same signal.
func (e *InterruptedError) Preemption() bool {
	return e.Signal == syscall.SIGTERM || e.Signal == syscall.SIGUSR1
}

// ResumableError means the job was stopped by a preemption signal (SIGTERM or
// SIGUSR1) and every rank stopped cleanly saying it can resume (exit code 75,
// ExitResumable): the built-in engine saved a checkpoint. gtrain exits 75.
type ResumableError struct{ Signal os.Signal }

func (e *ResumableError) Error() string {
	return fmt.Sprintf("launch: stopped by %s: every rank saved its state and can resume", signalName(e.Signal))
}

// ExitResumable is the exit code of a rank (and of gtrain) that was stopped
// by a preemption signal after saving what it needs to resume (sysexits'
// EX_TEMPFAIL: "try again later").
const ExitResumable = 75

// signalName is "SIGUSR1" rather than Go's "user defined signal 1".
func signalName(s os.Signal) string {
	if n, ok := s.(syscall.Signal); ok {
		if name := unix.SignalName(n); name != "" {
			return name
		}
	}
	return fmt.Sprint(s)
}

// Code is 128 + the signal number.
func (e *InterruptedError) Code() int {
	if s, ok := e.Signal.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 130
}

// AgentLostError means a node agent ended or went silent without finishing
// its ranks: the host crashed, the connection dropped, or the agent failed.
type AgentLostError struct {
	Host   string
	Node   int
	Err    error
	Stderr string // the agent's last output on stderr, if any
	// AlsoFailed names, briefly, the other failures of the same attempt.
	AlsoFailed []string

	at time.Time // when the launcher found it lost
}

func (e *AgentLostError) Error() string {
	s := fmt.Sprintf("launch: agent on %s (node %d) lost: %v", e.Host, e.Node, e.Err)
	if t := strings.TrimSpace(e.Stderr); t != "" {
		s += ": " + lastLine(t)
	}
	return s
}

func (e *AgentLostError) Unwrap() error { return e.Err }

// short is the host and what happened, for lists of other failures.
func (e *AgentLostError) short() string {
	if e.Node < 0 {
		return "agents on " + e.Host + " lost"
	}
	return fmt.Sprintf("agent on %s (node %d) lost", e.Host, e.Node)
}

// Report is the account printed when the job fails: the error and the other
// failures of the attempt.
func (e *AgentLostError) Report() string {
	if len(e.AlsoFailed) == 0 {
		return e.Error()
	}
	return e.Error() + "\nalso failed: " + strings.Join(e.AlsoFailed, "; ")
}

// rootCause picks, among the failures of one attempt, the one that most
// likely caused the others, and returns it with its report, which names the
// others briefly. The rule does not depend on the order the events arrived
// in: a rank killed by a signal gtrain did not send (the OOM killer, a
// crash, a hand) comes first, then a lost agent (its host's ranks are gone
// too), then a rank that exited non-zero, and last a rank that failed
// because a peer died; within each, the earliest, then the lowest rank.
func rootCause(ranks []*RankFailedError, lost []*AgentLostError) (error, string) {
	type failure struct {
		err   error
		class int
		at    time.Time
		order int
		short string
	}
	var fs []failure
	for _, r := range ranks {
		class := 2
		switch {
		case r.Signal != "":
			class = 0
		case r.PeerFailed:
			class = 3
		}
		fs = append(fs, failure{r, class, r.Time, r.Rank, r.short()})
	}
	for _, l := range lost {
		fs = append(fs, failure{l, 1, l.at, l.Node, l.short()})
	}
	if len(fs) == 0 {
		return nil, ""
	}
	slices.SortStableFunc(fs, func(a, b failure) int {
		return cmp.Or(cmp.Compare(a.class, b.class), a.at.Compare(b.at), cmp.Compare(a.order, b.order))
	})
	var others []string
	for _, f := range fs[1:] {
		others = append(others, f.short)
	}
	switch root := fs[0].err.(type) {
	case *RankFailedError:
		root.AlsoFailed = others
		return root, root.Report()
	case *AgentLostError:
		root.AlsoFailed = others
		return root, root.Report()
	}
	return fs[0].err, fs[0].err.Error()
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

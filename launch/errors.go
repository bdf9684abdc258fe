package launch

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// UsageError marks an error in what the user asked for (flags, hostfile,
// filters): gtrain exits with code 2 for it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// RankFailedError is the first rank of a job that ended badly on its own
// (not killed by gtrain's teardown). gtrain exits with its Code.
type RankFailedError struct {
	Host      string
	Node      int
	Rank      int
	LocalRank int
	PID       int
	Code      int      // exit code, 128+n when killed by signal n
	Signal    string   // the signal's name when a signal ended it
	Message   string   // from TORCHELASTIC_ERROR_FILE, if the rank wrote one
	LastLines []string // its last lines of output
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

// Report is the multi-line account printed when the job fails: the error and
// the rank's last lines of output.
func (e *RankFailedError) Report() string {
	var b strings.Builder
	b.WriteString(e.Error())
	if len(e.LastLines) > 0 {
		fmt.Fprintf(&b, "\nlast %d line(s) of rank %d:", len(e.LastLines), e.Rank)
		for _, l := range e.LastLines {
			b.WriteString("\n  | " + l)
		}
	}
	return b.String()
}

// InterruptedError means gtrain itself was signalled (Ctrl-C, SIGTERM) and tore
// the job down. gtrain exits with 128 + the signal number, like a shell.
type InterruptedError struct{ Signal os.Signal }

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("launch: interrupted by %v: job stopped", e.Signal)
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
}

func (e *AgentLostError) Error() string {
	s := fmt.Sprintf("launch: agent on %s (node %d) lost: %v", e.Host, e.Node, e.Err)
	if t := strings.TrimSpace(e.Stderr); t != "" {
		s += ": " + lastLine(t)
	}
	return s
}

func (e *AgentLostError) Unwrap() error { return e.Err }

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

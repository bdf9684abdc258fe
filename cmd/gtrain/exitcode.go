package main

import (
	"errors"
	"strings"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/launch"
)

// Exit codes of gtrain (documented in README.md). Besides these, gtrain exits
// with the exit code of the first rank that failed, and with 128+n when it was
// interrupted by signal n.
const (
	ExitOK      = 0 // every rank exited 0
	ExitFailure = 1 // gtrain itself failed: an agent was lost, a process could not start, I/O
	ExitUsage   = 2 // bad flags, config, job file, hostfile or filter
)

// ExitCode maps an error to gtrain's exit code. It is the only place that
// does.
func ExitCode(err error) int {
	var (
		rank  *launch.RankFailedError
		intr  *launch.InterruptedError
		usage *launch.UsageError
		parse *hostfiles.ParseError
	)
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &rank):
		if rank.Code <= 0 || rank.Code > 255 {
			return ExitFailure
		}
		return rank.Code
	case errors.As(err, &intr):
		return intr.Code()
	case errors.As(err, &usage), errors.As(err, &parse), isCobraUsage(err):
		return ExitUsage
	default:
		return ExitFailure
	}
}

// isCobraUsage recognises cobra's own argument errors, which are plain.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires at least", "invalid argument"} {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, " "+p) {
			return true
		}
	}
	return false
}

package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
	"github.com/gtrain/gtrain/launch"
)

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, ExitOK},
		{"rank code", &launch.RankFailedError{Rank: 3, Code: 7}, 7},
		{"wrapped rank code", fmt.Errorf("x: %w", &launch.RankFailedError{Code: 42}), 42},
		{"rank killed by signal", &launch.RankFailedError{Code: 137, Signal: "SIGKILL"}, 137},
		{"rank code out of range", &launch.RankFailedError{Code: 300}, ExitFailure},
		{"interrupt", &launch.InterruptedError{Signal: syscall.SIGINT}, 130},
		{"terminate", &launch.InterruptedError{Signal: syscall.SIGTERM}, 143},
		{"preempted, saved", &launch.ResumableError{Signal: syscall.SIGUSR1}, ExitResumable},
		{"worker preempted, saved", &silentError{&launch.ResumableError{Signal: syscall.SIGTERM}}, 75},
		{"preempted, not saved", &launch.InterruptedError{Signal: syscall.SIGUSR1}, 138},
		{"usage", &usage.Error{Err: errors.New("bad")}, ExitUsage},
		{"hostfile", &hostfiles.ParseError{File: "h", Line: 2, Msg: "bad"}, ExitUsage},
		{"bad input file", fmt.Errorf("hostfiles: %w", &userfile.Error{Path: "h", Err: syscall.EISDIR}), ExitUsage},
		{"input file too large", &userfile.Error{Path: "h", Err: userfile.ErrTooLarge, Limit: 1 << 20}, ExitUsage},
		// Typed errors only: a message that reads like a usage error is not one.
		{"wrapped EINVAL from I/O", fmt.Errorf("data prepare: read x: %w", &os.PathError{Op: "read", Path: "x", Err: syscall.EINVAL}), ExitFailure},
		{"untyped text of cobra's", errors.New("unknown flag: --bogus"), ExitFailure},
		{"read error of an input file", fmt.Errorf("config: read c: %w", syscall.EIO), ExitFailure},
		{"agent lost", &launch.AgentLostError{Host: "h", Err: errors.New("eof")}, ExitFailure},
		{"silent keeps code", &silentError{&launch.RankFailedError{Code: 5}}, 5},
		{"other", errors.New("disk on fire"), ExitFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ExitCode(tt.err); got != tt.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
}

// TestCobraUsageErrorsAreTyped: every way of calling gtrain wrongly that
// cobra itself detects (unknown commands and flags, bad flag values, missing
// and extra arguments) is a usage error, exit 2, from the real command tree;
// each is one line that names the command.
func TestCobraUsageErrorsAreTyped(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"no-such-command"}, `unknown command "no-such-command" for "gtrain"`},
		{[]string{"runn"}, `did you mean "run"?`},
		{[]string{"ckpt", "bogus"}, `unknown command "bogus" for "gtrain ckpt"`},
		{[]string{"data", "bogus"}, `unknown command "bogus" for "gtrain data"`},
		{[]string{"completion", "bash", "extra"}, `completion bash: unexpected argument "extra"`},
		{[]string{"run", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"plan", "-Z"}, "unknown shorthand flag: 'Z' in -Z"},
		{[]string{"run", "--nproc-per-node", "x", "--", "true"}, `invalid argument "x" for "--nproc-per-node" flag`},
		{[]string{"run", "--nproc-per-node"}, "flag needs an argument: --nproc-per-node"},
		{[]string{"ckpt", "ls"}, "ckpt ls: missing ROOT: usage: gtrain ckpt ls ROOT [flags]"},
		{[]string{"ckpt", "verify"}, "ckpt verify: missing "},
		{[]string{"ckpt", "export"}, "ckpt export: missing DIR"},
		{[]string{"resume"}, "resume: missing DIR: usage: gtrain resume [flags] DIR"},
		{[]string{"ckpt", "ls", "a", "b"}, `ckpt ls: unexpected argument "b"`},
		{[]string{"plan", "extra"}, `plan: unexpected argument "extra"`},
		{[]string{"version", "extra"}, `version: unexpected argument "extra"`},
		{[]string{"hosts", "check", "extra"}, `hosts check: unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut strings.Builder
			ios := &IOStreams{In: strings.NewReader(""), Out: &out, Err: &errOut, Getenv: func(string) string { return "" }}
			root := NewCmdRoot(ios, &signals{abort: make(chan struct{})})
			root.SetArgs(tt.args)
			err := root.Execute()
			var ue *usage.Error
			if !errors.As(err, &ue) || ExitCode(err) != ExitUsage {
				t.Fatalf("gtrain %s: error %v (%T), exit code %d; want a *usage.Error, exit 2", strings.Join(tt.args, " "), err, err, ExitCode(err))
			}
			if msg := err.Error(); !strings.Contains(msg, tt.msg) || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line containing %q", msg, tt.msg)
			}
		})
	}
}

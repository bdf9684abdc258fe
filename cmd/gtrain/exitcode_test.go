package main

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
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
		{"usage", &launch.UsageError{Err: errors.New("bad")}, ExitUsage},
		{"hostfile", &hostfiles.ParseError{File: "h", Line: 2, Msg: "bad"}, ExitUsage},
		{"cobra unknown flag", errors.New("unknown flag: --bogus"), ExitUsage},
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

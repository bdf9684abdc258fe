package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/planner"
)

// addDetectFlags adds --detect and the SSH flags it reaches the hosts with.
func addDetectFlags(f *pflag.FlagSet, o *PlanOptions) {
	f.BoolVar(&o.Detect, "detect", false, "with --hostfile: plan for the hosts as they report themselves (gtrain's agents start there as for a run, detect GPUs, memory, CPUs and links, join and exit; unequal hosts are planned as the weakest, with a warning) instead of the hostfile's slots as catalog GPUs; starts no rank")
	addSSHFlags(f, &o.SSH)
}

// detect replaces the hostfile of a --detect plan by the cluster its hosts
// report (planner.TopologyOf their facts); the planner's warnings go to
// stderr. Without --detect it does nothing.
func (o *PlanOptions) detect(ctx context.Context) error {
	if !o.Detect {
		return nil
	}
	switch {
	case o.Request.Hostfile == "":
		return usage.Errorf("plan: --detect asks a hostfile's hosts what they are: give --hostfile")
	case o.SSH.ConnectTimeout <= 0:
		return usage.Errorf("plan: --ssh-timeout %v: must be positive", o.SSH.ConnectTimeout)
	}
	r := launch.Request{Hostfile: o.Request.Hostfile, SSH: o.SSH, NprocPerNode: 1, Getenv: o.IO.Getenv, JoinTimeout: 60 * time.Second}
	notices := &shownLines{w: o.IO.Err}
	hosts, err := r.DetectHosts(ctx, notices)
	if err != nil {
		if notices.shown("gtrain: " + err.Error()) {
			return &silentError{err} // the launcher's notice said it
		}
		return err
	}
	top, warns, err := planner.TopologyOf(hosts)
	for _, w := range warns {
		fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", w)
	}
	if err != nil {
		return fmt.Errorf("plan --detect: %w", err)
	}
	o.Request.Hostfile, o.Request.Detected = "", &top
	return nil
}

// shownLines passes the launcher's notices on to w and remembers them
// (the first maxShownLines), so that the error a failed detection already
// printed as its notice is not printed a second time.
type shownLines struct {
	w     io.Writer
	mu    sync.Mutex
	lines map[string]bool
}

const maxShownLines = 1024

func (s *shownLines) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lines == nil {
		s.lines = map[string]bool{}
	}
	for line := range strings.Lines(string(p)) {
		if len(s.lines) < maxShownLines {
			s.lines[strings.TrimSuffix(line, "\n")] = true
		}
	}
	return s.w.Write(p)
}

// shown reports whether line was written.
func (s *shownLines) shown(line string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lines[line]
}

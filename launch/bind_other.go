//go:build !linux

package launch

import "os/exec"

// startBound starts cmd unbound: binding is Linux's (sched_setaffinity,
// set_mempolicy).
func startBound(cmd *exec.Cmd, _ *Binding, _ func(string), _ <-chan struct{}) error {
	return cmd.Start()
}

// processAffinity is unknown off Linux.
func processAffinity() []int { return nil }

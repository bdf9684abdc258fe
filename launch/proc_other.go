//go:build !linux

package launch

import "syscall"

// rankAttr starts a rank in its own process group (no Pdeathsig off Linux).
func rankAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// agentAttr starts a local agent in its own process group.
func agentAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func becomeSubreaper() error { return nil }

func sweepOrphans(map[int]bool) []int { return nil }

func reapZombies(map[int]bool) {}

func signalGroup(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

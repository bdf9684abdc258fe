//go:build linux

package netns

import (
	"os"
	"syscall"
)

const supported = true

// hostSysProcAttr gives a host's processes their own UTS namespace, so that
// `hostname` inside host i prints its Host.Name, and kills them if the test
// process dies (a backstop; the sweep of the next run removes the rest).
func hostSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUTS,
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
}

// lockFile takes an exclusive flock on f; closing f releases it.
func lockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }

func kill(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }

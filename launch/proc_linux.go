package launch

import (
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// rankAttr starts a rank in its own process group, so that teardown can signal
// the rank and everything it spawned at once without touching other jobs, and
// asks the kernel to SIGKILL it should the agent die without tearing down.
func rankAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// agentAttr starts a local agent in its own process group (a terminal's Ctrl-C
// reaches only the launcher, which then stops the agents in order) and has the
// kernel send it SIGTERM, which it treats like a stop, if the launcher dies.
func agentAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// becomeSubreaper makes orphaned descendants of the agent (a rank's children
// that double-forked or called setsid to leave its process group) re-parent to
// the agent instead of init, so that sweepOrphans can still find them.
func becomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// sweepOrphans kills and reaps every child of this process whose PID is not
// in keep, and returns the PIDs of those that were still alive. Orphans
// re-parented to the agent show up here after their rank ended; the dead
// ones (zombies) are only reaped.
func sweepOrphans(keep map[int]bool) []int {
	var killed, reap []int
	for _, c := range children(keep) {
		reap = append(reap, c.pid)
		if c.state == 'Z' {
			continue
		}
		// Kill its group as well: an escaped daemon may lead a group of its own.
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
		_ = syscall.Kill(c.pid, syscall.SIGKILL)
		killed = append(killed, c.pid)
	}
	for _, pid := range reap {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
	}
	return killed
}

// reapZombies reaps children not in keep that have already exited, so that
// orphans dying during a long job do not pile up as zombies.
func reapZombies(keep map[int]bool) {
	for _, c := range children(keep) {
		if c.state == 'Z' {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(c.pid, &ws, syscall.WNOHANG, nil)
		}
	}
}

type proc struct {
	pid   int
	state byte
}

// children lists this process's children, except those in keep.
func children(keep map[int]bool) []proc {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || keep[pid] {
			continue
		}
		if ppid, state := procStat(pid); ppid == self {
			out = append(out, proc{pid, state})
		}
	}
	return out
}

// procStat returns the parent PID and state letter of pid from
// /proc/pid/stat, or -1 if it cannot be read.
func procStat(pid int) (int, byte) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1, 0
	}
	// The command name (field 2) may contain spaces and parentheses: skip to
	// the last ')'. Then: state, ppid.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1, 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return -1, 0
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return -1, 0
	}
	return ppid, f[0][0]
}

// signalGroup sends sig to the process group led by pid. A group that is
// already gone is not an error.
func signalGroup(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

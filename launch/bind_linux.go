package launch

import (
	"fmt"
	"os/exec"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"
)

// startBound starts cmd with b's CPU affinity and memory policy in effect
// from its first instruction. Both are per thread on Linux and a child
// inherits its parent thread's, and os/exec forks from the calling
// thread: so the start happens on a thread locked for the purpose and
// bound first. That thread is never unlocked, so no other goroutine of
// the agent ever runs with the rank's binding, and the Go runtime ends it
// when its goroutine returns, which it does only once hold is closed (the
// rank was reaped): the kernel sends a child's Pdeathsig when the thread
// that forked it ends, not the process. The rank's PID, process group and
// signals are exactly those of an unbound start.
//
// A memory policy the kernel refuses (a container's seccomp filter may
// forbid set_mempolicy) is no reason to fail a rank: warn reports it and
// the rank starts with the affinity alone.
func startBound(cmd *exec.Cmd, b *Binding, warn func(string), hold <-chan struct{}) error {
	if b == nil || (len(b.CPUs) == 0 && b.MemNode < 0) {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // and never unlocked: see above
		if len(b.CPUs) > 0 {
			if err := setAffinity(b.CPUs); err != nil {
				errc <- fmt.Errorf("bind to CPUs %s: %w (the host's cpuset may have changed; --bind none starts ranks unbound)", FormatCPUList(b.CPUs), err)
				return
			}
		}
		if b.MemNode >= 0 {
			if err := setPreferredNode(b.MemNode); err != nil {
				warn(fmt.Sprintf("memory policy: prefer NUMA node %d: %v; the rank runs with the kernel's default policy", b.MemNode, err))
			}
		}
		err := cmd.Start()
		errc <- err
		if err == nil {
			<-hold
		}
	}()
	return <-errc
}

// setAffinity binds the calling thread to cpus.
func setAffinity(cpus []int) error {
	set := unix.NewCPUSet(slices.Max(cpus) + 1)
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinityDynamic(0, set)
}

// setPreferredNode makes the calling thread's memory come from NUMA node
// node first (numactl --preferred): MPOL_PREFERRED rather than MPOL_BIND,
// so that a rank whose node is full spills to another node instead of
// being killed for want of memory.
func setPreferredNode(node int) error {
	mask := unix.NewCPUSet(node + 1) // a node mask has the layout of a CPU mask
	mask.Set(node)
	return unix.SetMemPolicyDynamic(unix.MPOL_PREFERRED, mask)
}

// maxCPUs bounds the CPU numbers gtrain handles (the kernel's largest
// NR_CPUS).
const maxCPUs = 8192

// processAffinity is the CPUs this process may run on (sched_getaffinity),
// or nil if it cannot be read.
func processAffinity() []int {
	set := unix.NewCPUSet(maxCPUs)
	if err := unix.SchedGetaffinityDynamic(0, set); err != nil {
		return nil
	}
	var cpus []int
	for c := range maxCPUs {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

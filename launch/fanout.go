package launch

import (
	"context"
	"sync"
)

// The SSH transport dials every host of a job from this one process, all
// at once (attempt.startAgents, HostCheck). Unbounded, a job of thousands
// of hosts would start thousands of key exchanges together: they share
// this machine's cores, so each takes as long as all of them, and a
// host's connect timeout, whose clock runs from the dial, expires before
// its turn comes. The slots below bound the dials in flight instead; the
// timeout starts once a dial has its slot. docs/benchmarks.md ("SSH
// fan-out") has the measurements and the arithmetic for 10,000 hosts.
const (
	// maxConcurrentDials bounds connect + handshake + login in flight. A
	// login costs the launcher about 1 ms of CPU (measured: 0.6-1.2 ms)
	// and takes a round trip or three plus the far sshd's fork, some
	// 20-50 ms on a real network: 64 in flight keep 1,300-3,200 logins a
	// second going, a few cores' worth, 10,000 hosts in 3-8 s.
	maxConcurrentDials = 64
	// maxConcurrentJumps bounds the handshakes with ProxyJump hosts in
	// flight. Behind a bastion every dial is first a login to the one
	// bastion, whose sshd (MaxStartups 10:30:100 by default) drops 30% of
	// new connections once 10 are unauthenticated; 8 stay under that
	// with room for its other users.
	maxConcurrentJumps = 8
)

// dialSlots bounds the dials of one SSH transport in flight. The zero
// value has the default sizes.
type dialSlots struct {
	once         sync.Once
	direct, jump chan struct{}
	// onWait, when set (tests), is called each time a dial finds every
	// slot taken and waits.
	onWait func()
}

// chans returns the semaphores, made with the default sizes on first use
// unless a test made them before.
func (d *dialSlots) chans() (direct, jump chan struct{}) {
	d.once.Do(func() {
		if d.direct == nil {
			d.direct = make(chan struct{}, maxConcurrentDials)
		}
		if d.jump == nil {
			d.jump = make(chan struct{}, maxConcurrentJumps)
		}
	})
	return d.direct, d.jump
}

// slotKey marks a context whose dial holds a slot.
type slotKey struct{}

// dialSlot waits for a slot to dial t and returns the context to dial it
// in and the function that gives the slot back. A dial made within that
// context is t's ProxyJump hop: it takes a jump slot, never a second
// direct one, which it could wait for forever once every direct slot is
// held by a dial waiting for its own hop.
func (s *SSH) dialSlot(ctx context.Context, t sshTarget) (context.Context, func(), error) {
	direct, jump := s.slots.chans()
	sem := direct
	if ctx.Value(slotKey{}) != nil {
		sem = jump
	}
	select {
	case sem <- struct{}{}:
	default:
		if s.slots.onWait != nil {
			s.slots.onWait()
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, &HostError{Host: t.Alias, Op: "wait for a free connection slot to " + t.Addr(), Err: context.Cause(ctx)}
		}
	}
	return context.WithValue(ctx, slotKey{}, true), func() { <-sem }, nil
}

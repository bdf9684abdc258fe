//go:build linux

package comm

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Single copy between ranks of one host: Linux cross-memory attach
// (process_vm_readv) copies straight from the peer process's buffer into
// ours, where the rings copy twice (into the ring, out of it). A rank may
// read a peer's memory when the kernel lets it ptrace the peer: same user,
// and Yama's ptrace_scope at 0, or at 1 with the peer declaring any process
// may (PR_SET_PTRACER_ANY, which every rank does here, as Open MPI does).
// Seccomp profiles that forbid the call (Docker's default) are caught by a
// probe. Each side records in the segment header whether it can read; a
// link reads only when both sides can, so both agree. GTRAIN_COMM_NO_CMA=1
// (or SHMConfig.NoCMA) turns it off.

// shmOffCMA is where side 0 records that it can read peers' memory; side 1
// at +shmSideStride.
const shmOffCMA = 320

var (
	cmaOnce sync.Once
	cmaOK   bool
)

// cmaUsable reports whether this process can use process_vm_readv on its
// peers, setting itself up for their reads once.
func cmaUsable() bool {
	cmaOnce.Do(func() { cmaOK = cmaProbe() == nil })
	return cmaOK
}

func cmaProbe() error {
	if os.Getenv("GTRAIN_COMM_NO_CMA") == "1" {
		return errors.New("turned off by GTRAIN_COMM_NO_CMA")
	}
	scope := "0"
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil {
		scope = strings.TrimSpace(string(b))
	}
	switch scope {
	case "0":
	case "1":
		if err := unix.Prctl(unix.PR_SET_PTRACER, ^uintptr(0), 0, 0, 0); err != nil { // PR_SET_PTRACER_ANY
			return fmt.Errorf("PR_SET_PTRACER: %w", err)
		}
	default:
		return fmt.Errorf("yama ptrace_scope %s forbids it", scope)
	}
	src, dst := uint64(0x6774726169_6e), uint64(0)
	err := cmaRead(os.Getpid(), unsafe.Slice((*byte)(unsafe.Pointer(&dst)), 8), uint64(uintptr(unsafe.Pointer(&src))))
	if err == nil && dst != src {
		err = errors.New("probe read the wrong bytes")
	}
	return err
}

// cmaRead copies len(dst) bytes at address addr of process pid into dst.
func cmaRead(pid int, dst []byte, addr uint64) error {
	for len(dst) > 0 {
		local := []unix.Iovec{{Base: &dst[0]}}
		local[0].SetLen(len(dst))
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}
		n, err := unix.ProcessVMReadv(pid, local, remote, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("process_vm_readv: %w", err)
		case n == 0:
			return errors.New("process_vm_readv: read nothing (peer memory gone?)")
		}
		dst, addr = dst[n:], addr+uint64(n)
	}
	return nil
}

// shmRecordCMA records in the header whether this side can read its peer.
func shmRecordCMA(mem []byte, side int, off bool) {
	v := uint64(0)
	if !off && cmaUsable() {
		v = 1
	}
	atomic.StoreUint64(shmWord(mem, shmOffCMA+side*shmSideStride), v)
}

// CanReadPeer reports whether ReadPeer works on this link: both sides
// could read the other's memory when they connected.
func (c *shmConn) CanReadPeer() bool { return c.cma }

// ReadPeer copies len(dst) bytes at address addr of the peer process into
// dst, in one copy.
func (c *shmConn) ReadPeer(dst []byte, addr uint64) error {
	if err := cmaRead(c.peerPID, dst, addr); err != nil {
		if !shmAlive(c.peerPID) {
			err = ErrPeerGone
		}
		return c.fail("read", err)
	}
	return nil
}

//go:build race

package comm

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// linkRaceSync makes the race detector see the ordering a link provides: a
// Send happens before the Recv of its message. It cannot see it through a
// shared-memory mapping at all, and over sockets the syscall package
// releases its ioSync only after write returns, so a fast reader can
// acquire before the writer has released (a false report when ranks of a
// test share one process). A shared-memory link releases before each
// publication of bytes (after it copied them from the sender's buffer) and
// acquires after each sighting of new bytes (before it copies them into
// the receiver's); a TCP link releases before it writes (the kernel's read
// of the buffer is invisible to the detector) and acquires after it read a
// message's length, before it writes into the receiver's buffer. Like ioSync it is one word for the
// whole process, so it also orders calls across links (a message's reply,
// sent on another link, follows it); it exists only in -race builds.
var linkRaceSync atomic.Uint64

func linkRaceRelease() { linkRaceSync.Add(1) }
func linkRaceAcquire() { linkRaceSync.Load() }

// linkRaceWrote tells the detector that the first n bytes of bufs were
// written, by a raw readv(2) that it cannot see (as unix.Readv does).
func linkRaceWrote(bufs [][]byte, n int) {
	for _, b := range bufs {
		if n <= 0 {
			return
		}
		if k := min(n, len(b)); k > 0 {
			runtime.RaceWriteRange(unsafe.Pointer(&b[0]), k)
			n -= k
		}
	}
}

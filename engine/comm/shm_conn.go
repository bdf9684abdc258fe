//go:build linux

package comm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Segment layout. The first page is the header; every word that one side
// writes while the other reads sits in its own 128-byte block (two cache
// lines, against adjacent-line prefetch), so producer and consumer never
// write the same line. Ring 0 carries lower → higher rank, ring 1 the
// reverse; each is a byte stream of messages framed as a u64 length and
// the bytes, so a message longer than the ring streams through it.
const (
	shmHeaderBytes   = 4096
	shmMagic         = 0x31766d6873746720 // "gtshmv1" (little-endian)
	shmOffMagic      = 0
	shmOffRing       = 8   // ring bytes
	shmOffRanks      = 16  // lower rank << 32 | higher rank
	shmOffMapped     = 128 // set to 1 by the higher rank once mapped
	shmOffPID        = 256 // pid of side 0 (lower rank); side 1 at +shmSideStride
	shmOffClosed     = 384 // side 0 closed its end; side 1 at +shmSideStride
	shmSideStride    = 256
	shmOffCtl        = 1024 // control block of ring d at +d*shmCtlStride
	shmCtlStride     = 512
	shmCtlHead       = 0   // bytes written, by the producer
	shmCtlTail       = 128 // bytes read, by the consumer
	shmCtlReaderWait = 256 // consumer sleeps on head
	shmCtlWriterWait = 384 // producer sleeps on tail
)

// Waiting: spin on the word for shmSpinFor (a message usually lands within
// microseconds, and a futex wake-up costs tens of them), then keep looking
// but give the CPU away between looks (to this rank's other goroutines,
// and with sched_yield to a peer waiting for this core) until shmYieldFor,
// then sleep on a futex on the word's low 32 bits in naps of shmNap,
// checking ctx, Close, the peer's closed flag and (every shmLiveEvery) that
// the peer process lives. A writer wakes the futex only when the reader
// said it sleeps. A longer spin measured no faster on a quiet machine, and
// with a busy process on the other core a 20 µs spin made a 4 KiB
// all-reduce take 60 µs, a 2 µs one 26 µs.
const (
	shmSpinFor   = 2 * time.Microsecond
	shmYieldFor  = time.Millisecond
	shmNap       = 10 * time.Millisecond
	shmLiveEvery = 100 * time.Millisecond
	shmChunk     = 128 << 10 // most bytes copied between publications of head/tail
)

func shmSegmentSize(ring int) int { return shmHeaderBytes + 2*ring }

func shmWord(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }

func shmInitHeader(mem []byte, ring, lo, hi int) {
	atomic.StoreUint64(shmWord(mem, shmOffRing), uint64(ring))
	atomic.StoreUint64(shmWord(mem, shmOffRanks), uint64(lo)<<32|uint64(hi))
	atomic.StoreUint64(shmWord(mem, shmOffPID), uint64(os.Getpid()))
	atomic.StoreUint64(shmWord(mem, shmOffMagic), shmMagic)
}

func shmCheckHeader(mem []byte, lo, hi int) error {
	if atomic.LoadUint64(shmWord(mem, shmOffMagic)) != shmMagic {
		return errors.New("not a gtrain segment (bad magic)")
	}
	if r := atomic.LoadUint64(shmWord(mem, shmOffRanks)); r != uint64(lo)<<32|uint64(hi) {
		return fmt.Errorf("segment is for ranks %d and %d, not %d and %d", r>>32, uint32(r), lo, hi)
	}
	ring := atomic.LoadUint64(shmWord(mem, shmOffRing))
	if ring < minSHMRingBytes || ring&(ring-1) != 0 || uint64(len(mem)) != uint64(shmSegmentSize(int(ring))) {
		return fmt.Errorf("ring of %d bytes in a segment of %d: corrupt", ring, len(mem))
	}
	return nil
}

// shmWaitMapped waits for the higher rank to map a new segment.
func shmWaitMapped(ctx context.Context, mem []byte) error {
	return shmAwait(shmWord(mem, shmOffMapped), 0, nil, func() error { return context.Cause(ctx) })
}

// shmRing is one direction of a link, as seen by its producer or consumer.
type shmRing struct {
	head, tail             *uint64
	readerWait, writerWait *uint64
	data                   []byte
	size, mask             uint64
	chunk                  uint64 // bytes copied between publications
	pos                    uint64 // local head (producer) or tail (consumer)
	pub                    uint64 // pos as last published
}

func newSHMRing(mem []byte, d int, size uint64) shmRing {
	ctl := shmOffCtl + d*shmCtlStride
	lo := shmHeaderBytes + d*int(size)
	return shmRing{
		head: shmWord(mem, ctl+shmCtlHead), tail: shmWord(mem, ctl+shmCtlTail),
		readerWait: shmWord(mem, ctl+shmCtlReaderWait), writerWait: shmWord(mem, ctl+shmCtlWriterWait),
		data: mem[lo : lo+int(size) : lo+int(size)], size: size, mask: size - 1,
		chunk: min(shmChunk, size/4), // so that both sides work at once
	}
}

// publishHead makes written bytes visible and wakes a sleeping reader.
func (r *shmRing) publishHead() {
	if r.pos == r.pub {
		return
	}
	linkRaceRelease() // after the bytes were read from the sender's buffer: see link_race.go
	atomic.StoreUint64(r.head, r.pos)
	r.pub = r.pos
	if atomic.LoadUint64(r.readerWait) != 0 {
		shmFutexWake(r.head, 1)
	}
}

// publishTail frees read bytes and wakes a sleeping writer.
func (r *shmRing) publishTail() {
	if r.pos == r.pub {
		return
	}
	atomic.StoreUint64(r.tail, r.pos)
	r.pub = r.pos
	if atomic.LoadUint64(r.writerWait) != 0 {
		shmFutexWake(r.tail, 1)
	}
}

// Messages are padded to a multiple of 8 bytes in the ring, so that every
// message starts 8-byte aligned and a reader can compute on a message in
// place (see shm_progress.go), whatever its element type.
func shmPadding(n int) int { return -n & 7 }

var shmZeros [8]byte

// shmConn is a link over one mapped segment.
type shmConn struct {
	peer       int
	peerPID    int
	mem        []byte
	tx, rx     shmRing
	ownClosed  *uint64
	peerClosed *uint64
	sendHdr    [8]byte
	recvHdr    [8]byte
	sendErr    error // sticky; under sendMu
	recvErr    error // sticky; under recvMu
	closed     atomic.Bool
	// sendMu and recvMu are held by calls, and by Close before it unmaps.
	// They also order successive calls from different goroutines for the
	// race detector, which cannot see the atomics in the shared mapping.
	sendMu, recvMu sync.Mutex
}

func newSHMConn(mem []byte, peer int, higher bool) *shmConn {
	side := 0
	if higher {
		side = 1
	}
	size := atomic.LoadUint64(shmWord(mem, shmOffRing))
	return &shmConn{
		peer:       peer,
		peerPID:    int(atomic.LoadUint64(shmWord(mem, shmOffPID+(1-side)*shmSideStride))),
		mem:        mem,
		tx:         newSHMRing(mem, side, size),
		rx:         newSHMRing(mem, 1-side, size),
		ownClosed:  shmWord(mem, shmOffClosed+side*shmSideStride),
		peerClosed: shmWord(mem, shmOffClosed+(1-side)*shmSideStride),
	}
}

// SendRoom returns how many bytes of messages Send takes now without
// waiting, counting the 8-byte length of each.
func (c *shmConn) SendRoom() int {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	return int(c.tx.size - (c.tx.pos - atomic.LoadUint64(c.tx.tail)))
}

// Send copies the length and b into the ring, streaming when b is longer
// than the ring.
func (c *shmConn) Send(ctx context.Context, b []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.precheck(ctx, c.sendErr); err != nil {
		return c.fail("send", err)
	}
	start := c.tx.pos
	binary.LittleEndian.PutUint64(c.sendHdr[:], uint64(len(b)))
	err := c.put(ctx, c.sendHdr[:])
	if err == nil {
		err = c.put(ctx, b)
	}
	if pad := shmPadding(len(b)); err == nil && pad > 0 {
		err = c.put(ctx, shmZeros[:pad])
	}
	c.tx.publishHead()
	if err != nil {
		if c.tx.pos != start {
			c.sendErr = ErrLinkBroken
		}
		return c.fail("send", err)
	}
	return nil
}

// Recv copies the next message into b; its length must be len(b). A
// message of another length is consumed and reported as ErrMessageLength.
func (c *shmConn) Recv(ctx context.Context, b []byte) error {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if err := c.precheck(ctx, c.recvErr); err != nil {
		return c.fail("recv", err)
	}
	start := c.rx.pos
	err := c.get(ctx, c.recvHdr[:], 8)
	n := binary.LittleEndian.Uint64(c.recvHdr[:])
	if n > c.rx.size<<20 { // a length no Send writes: the stream is out of step
		err = fmt.Errorf("message length %d in the ring: stream out of step", n)
	}
	switch {
	case err != nil:
	case n == uint64(len(b)):
		err = c.get(ctx, b, n)
	default:
		if err = c.get(ctx, nil, n); err == nil {
			err = fmt.Errorf("%w: got a message of %d bytes, want %d (the ranks disagree about the call)", ErrMessageLength, n, len(b))
		}
	}
	if pad := shmPadding(int(n)); pad > 0 && (err == nil || errors.Is(err, ErrMessageLength)) {
		if perr := c.get(ctx, nil, uint64(pad)); perr != nil {
			err = perr
		}
	}
	c.rx.publishTail()
	if err != nil {
		if c.rx.pos != start && !errors.Is(err, ErrMessageLength) {
			c.recvErr = ErrLinkBroken
		}
		return c.fail("recv", err)
	}
	return nil
}

func (c *shmConn) precheck(ctx context.Context, sticky error) error {
	switch {
	case c.closed.Load():
		return ErrLinkClosed
	case sticky != nil:
		return sticky
	case ctx.Err() != nil:
		return context.Cause(ctx)
	}
	return nil
}

// put copies p into the transmit ring, waiting for space as needed.
func (c *shmConn) put(ctx context.Context, p []byte) error {
	r := &c.tx
	var next time.Time
	for len(p) > 0 {
		free := r.size - (r.pos - atomic.LoadUint64(r.tail))
		if free == 0 {
			r.publishHead()
			if err := shmAwait(r.tail, r.pos-r.size, r.writerWait, func() error { return c.check(ctx, &next) }); err != nil {
				return err
			}
			continue
		}
		n := min(free, uint64(len(p)), r.chunk)
		k := ringCopy(r.data[r.pos&r.mask:], p[:n])
		ringCopy(r.data, p[k:n])
		r.pos += n
		p = p[n:]
		if r.pos-r.pub >= r.chunk {
			r.publishHead()
		}
	}
	return nil
}

// get copies n bytes from the receive ring into p, or skips them when p
// is nil, waiting for data as needed.
func (c *shmConn) get(ctx context.Context, p []byte, n uint64) error {
	r := &c.rx
	var next time.Time
	for n > 0 {
		avail := atomic.LoadUint64(r.head) - r.pos
		if avail == 0 {
			r.publishTail()
			if err := shmAwait(r.head, r.pos, r.readerWait, func() error { return c.check(ctx, &next) }); err != nil {
				return err
			}
			continue
		}
		linkRaceAcquire() // before the bytes are written into the receiver's buffer
		k := min(avail, n, r.chunk)
		if p != nil {
			m := ringCopy(p[:k], r.data[r.pos&r.mask:])
			ringCopy(p[m:k], r.data)
			p = p[k:]
		}
		r.pos += k
		n -= k
		if r.pos-r.pub >= r.chunk {
			r.publishTail()
		}
	}
	return nil
}

// check is called between naps of a wait: it ends the wait when this end
// closed, ctx ended, the peer closed its end or its process is gone.
func (c *shmConn) check(ctx context.Context, next *time.Time) error {
	switch {
	case c.closed.Load():
		return ErrLinkClosed
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case atomic.LoadUint64(c.peerClosed) != 0:
		return ErrPeerClosed
	}
	if now := time.Now(); now.After(*next) {
		*next = now.Add(shmLiveEvery)
		if !shmAlive(c.peerPID) {
			return ErrPeerGone
		}
	}
	return nil
}

func (c *shmConn) fail(op string, err error) error {
	return &LinkError{Transport: "shm", Op: op, Peer: c.peer, Addr: "pid " + strconv.Itoa(c.peerPID), Err: err}
}

// Close marks this end closed, wakes every sleeper on both ends, waits for
// calls in flight to return and unmaps the segment.
func (c *shmConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	atomic.StoreUint64(c.ownClosed, 1)
	for _, r := range []*shmRing{&c.tx, &c.rx} {
		shmFutexWake(r.head, 1<<30)
		shmFutexWake(r.tail, 1<<30)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	return unix.Munmap(c.mem)
}

// idler paces a wait that found nothing to do yet, as the comment on
// shmSpinFor says: spin, then give the CPU away between looks. wait
// reports false once shmYieldFor has passed; the caller then sleeps its
// own way (a futex on one word, a nap in a loop over several links).
type idler struct {
	since time.Time
	n     int
	// alone: the waiting goroutine is the only one that moves this rank's
	// data (a progress loop), so it never calls runtime.Gosched. Gosched
	// wakes an idle P's thread (the runtime's wakep) to look for the
	// goroutine, and on a small, busy host that thread takes a CPU from the
	// peer rank or gets this one preempted: at load 4-8 on 2 CPUs, 2 ranks,
	// the median 8 MiB all-reduce was 0.7-3.3 ms in 6 runs of 200 with
	// Gosched, 0.5-0.7 ms without (Open MPI 0.6-0.8), interleaved
	// (docs/benchmarks.md, issue 19).
	alone bool
}

// shmGosched and shmSchedYield give the CPU away; tests count the calls.
var (
	shmGosched    = runtime.Gosched
	shmSchedYield = func() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
)

func (w *idler) reset() { w.n = 0 }

func (w *idler) wait() bool {
	if w.n == 0 {
		w.since = time.Now()
	}
	w.n++
	switch d := time.Since(w.since); {
	case d < shmSpinFor:
	case d >= shmYieldFor:
		return false
	case w.n%2 == 0 && !w.alone:
		shmGosched() // another goroutine of this rank may be the one to make progress
	default:
		shmSchedYield() // or another process
	}
	return true
}

// shmPollNap is how long a progress loop (shm_progress.go) that has found
// nothing to do for shmYieldFor sleeps between looks at its links: it
// watches several words, so it cannot sleep on one futex, and the peer
// does not wake it.
const shmPollNap = 50 * time.Microsecond

// shmNapPoll sleeps for shmPollNap with nanosleep, not time.Sleep: the Go
// runtime's timers wait in epoll with a millisecond resolution, so
// time.Sleep(50µs) took 1.02 ms at least here (2026-11-26, Go 1.26). Once
// both ranks of a collective nap (one was descheduled for a millisecond on
// a loaded host), every chunk handed between them cost a millisecond or
// more; at load 7-15 this halved the median 4 and 8 MiB all-reduce of two
// ranks (docs/benchmarks.md, issue 19).
func shmNapPoll() {
	ts := unix.NsecToTimespec(shmPollNap.Nanoseconds())
	unix.Nanosleep(&ts, nil) // EINTR: an early look costs nothing
}

// shmAwait waits until *w != v: spinning, then yielding, then sleeping on
// the futex (announced in flag, when not nil), with check between naps.
func shmAwait(w *uint64, v uint64, flag *uint64, check func() error) error {
	var idle idler
	for idle.wait() {
		if atomic.LoadUint64(w) != v {
			return nil
		}
	}
	for {
		if err := check(); err != nil {
			if atomic.LoadUint64(w) != v {
				return nil
			}
			return err
		}
		if flag != nil {
			atomic.StoreUint64(flag, 1) // then re-check: see publishHead
		}
		if atomic.LoadUint64(w) == v {
			shmFutexWait(w, v, shmNap)
		}
		if flag != nil {
			atomic.StoreUint64(flag, 0)
		}
		if atomic.LoadUint64(w) != v {
			return nil
		}
	}
}

// shmAlive reports whether process pid exists and is not a zombie (a
// killed child stays one until its parent reaps it).
func shmAlive(pid int) bool {
	if pid <= 0 {
		return true
	}
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// The futex operations are process-shared (not FUTEX_PRIVATE), since the
// word lives in a mapping other processes share. Futexes are 32-bit: the
// low half of the u64 word, which changes whenever the word does.
const (
	shmOpWait = 0 // FUTEX_WAIT
	shmOpWake = 1 // FUTEX_WAKE
)

var shmLowHalf = func() uintptr {
	x := uint64(1)
	if *(*byte)(unsafe.Pointer(&x)) == 1 {
		return 0
	}
	return 4
}()

func shmFutexWait(w *uint64, v uint64, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w))+shmLowHalf, shmOpWait, uintptr(uint32(v)), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func shmFutexWake(w *uint64, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w))+shmLowHalf, shmOpWake, uintptr(n), 0, 0, 0)
}

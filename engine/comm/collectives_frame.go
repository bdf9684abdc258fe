package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

// Framing. The first message of an operation from one rank to another is a
// 32-byte header describing the call: kind, sequence number, dtype, reduce
// op, element count, root, algorithm and chunk size. The receiver checks it
// against its own call before it touches any payload, so mismatched calls
// are reported instead of corrupting data. Later messages of the operation
// between the same two ranks (all payload chunks) carry no header: one
// header per operation per peer and direction.

const hdrSize = 32

const (
	hdrMagic   = 0x6774 // "gt"
	hdrVersion = 1
)

// opKind is the operation a header describes.
type opKind uint8

const (
	kAllReduce opKind = iota + 1
	kReduceScatter
	kAllGather
	kBroadcast
	kReduce
	kGather
	kScatter
	kBarrier
	kSend
	kSplit
)

var kindNames = [...]string{
	kAllReduce: "all_reduce", kReduceScatter: "reduce_scatter", kAllGather: "all_gather",
	kBroadcast: "broadcast", kReduce: "reduce", kGather: "gather", kScatter: "scatter",
	kBarrier: "barrier", kSend: "send", kSplit: "split",
}

func (k opKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("op kind %d", uint8(k))
}

// header describes one call; every rank of the call must agree on all of it.
type header struct {
	kind  opKind
	dt    DType
	op    Op
	alg   algorithm
	root  int32
	chunk uint32
	seq   uint64
	count int64
}

func (h header) encode(b *[hdrSize]byte) {
	le := binary.LittleEndian
	le.PutUint16(b[0:], hdrMagic)
	b[2], b[3], b[4], b[5], b[6], b[7] = hdrVersion, byte(h.kind), byte(h.dt), byte(h.op), byte(h.alg), 0
	le.PutUint32(b[8:], uint32(h.root))
	le.PutUint32(b[12:], h.chunk)
	le.PutUint64(b[16:], h.seq)
	le.PutUint64(b[24:], uint64(h.count))
}

func decodeHeader(b *[hdrSize]byte) (header, bool) {
	le := binary.LittleEndian
	if le.Uint16(b[0:]) != hdrMagic || b[2] != hdrVersion {
		return header{}, false
	}
	return header{
		kind: opKind(b[3]), dt: DType(b[4]), op: Op(b[5]), alg: algorithm(b[6]),
		root: int32(le.Uint32(b[8:])), chunk: le.Uint32(b[12:]),
		seq: le.Uint64(b[16:]), count: int64(le.Uint64(b[24:])),
	}, true
}

// mismatch describes how got (a peer's call) differs from want (ours), as
// "called reduce_scatter (count 1000, not 1024)"; "" if they agree.
func (want header) mismatch(got header) string {
	if got == want {
		return ""
	}
	var d []string
	add := func(differs bool, format string, a ...any) {
		if differs {
			d = append(d, fmt.Sprintf(format, a...))
		}
	}
	add(got.count != want.count, "count %d, not %d", got.count, want.count)
	add(got.dt != want.dt, "dtype %v, not %v", got.dt, want.dt)
	if got.kind == want.kind { // the rest only means something for one kind
		add(got.op != want.op, "op %v, not %v", got.op, want.op)
		add(got.root != want.root, "root %d, not %d", got.root, want.root)
		add(got.alg != want.alg, "algorithm %v, not %v: Options.Algorithm or RingThreshold differ", got.alg, want.alg)
		add(got.chunk != want.chunk, "chunk %d bytes, not %d: Options.ChunkBytes differs", got.chunk, want.chunk)
	}
	if got.kind == want.kind && got.seq == want.seq && len(d) == 0 {
		return ""
	}
	s := "called " + got.kind.String()
	if got.seq != want.seq {
		s += fmt.Sprintf(" #%d", got.seq)
	}
	if len(d) > 0 {
		s += " (" + strings.Join(d, "; ") + ")"
	}
	return s
}

// opState is one executing operation: its context, its header, and which
// peers it has exchanged headers with.
type opState struct {
	c    *Communicator
	ctx  context.Context // the caller's context, bounded by Options.Timeout
	alg  algorithm
	want header
	hdr  [hdrSize]byte
}

// sendHeader sends the operation's header to peer, once. It uses the
// operation's context, not the cancellable one of a parallel section, so
// that when this rank finds a mismatch its own header still reaches the
// peer, which then reports the mismatch too.
func (o *opState) sendHeader(peer int) error {
	if o.c.sent[peer] {
		return nil
	}
	o.c.sent[peer] = true
	o.c.flight.wait(peer)
	if err := o.c.conns[peer].Send(o.ctx, o.hdr[:]); err != nil {
		return o.c.joinErr(o.ctx, peer, err)
	}
	return nil
}

// recvHeader receives peer's header for this operation, once, and checks it.
func (o *opState) recvHeader(ctx context.Context, peer int) error {
	if o.c.got[peer] {
		return nil
	}
	o.c.got[peer] = true
	b := &o.c.hdrIn[peer]
	o.c.flight.wait(peer)
	if err := o.c.conns[peer].Recv(ctx, b[:]); err != nil {
		return o.c.joinErr(o.ctx, peer, err)
	}
	return o.checkHeader(peer)
}

// checkHeader checks the header received from peer against this call.
func (o *opState) checkHeader(peer int) error {
	world, host := o.c.describe(peer)
	got, ok := decodeHeader(&o.c.hdrIn[peer])
	if !ok {
		return &MismatchError{Peer: peer, World: world, Host: host, PeerOp: "?",
			Detail: "sent a malformed header (not a gtrain comm peer, or a different version)"}
	}
	if d := o.want.mismatch(got); d != "" {
		return &MismatchError{Peer: peer, World: world, Host: host, PeerOp: got.kind.String(), Detail: d}
	}
	return nil
}

// chunkLen returns how many elements of dt make one chunk.
func (o *opState) chunkLen(dt DType) int { return max(1, o.c.opts.ChunkBytes/max(1, dt.Size())) }

// sendRaw sends one payload message (nothing for an empty buffer).
func (o *opState) sendRaw(ctx context.Context, peer int, b Buffer) error {
	if len(b.b) == 0 {
		return nil
	}
	o.c.flight.wait(peer)
	if err := o.c.conns[peer].Send(ctx, b.b); err != nil {
		return o.c.peerErr(o.ctx, peer, err)
	}
	return nil
}

// recvRaw receives one payload message of exactly len(b) bytes.
func (o *opState) recvRaw(ctx context.Context, peer int, b Buffer) error {
	if len(b.b) == 0 {
		return nil
	}
	o.c.flight.wait(peer)
	if err := o.c.conns[peer].Recv(ctx, b.b); err != nil {
		return o.c.peerErr(o.ctx, peer, err)
	}
	return nil
}

// send sends b to peer: the header if not yet sent, then b in chunks.
func (o *opState) send(ctx context.Context, peer int, b Buffer) error {
	if err := o.sendHeader(peer); err != nil {
		return err
	}
	n := o.chunkLen(b.dt)
	for lo := 0; lo < b.Len(); lo += n {
		if err := o.sendRaw(ctx, peer, b.Slice(lo, min(lo+n, b.Len()))); err != nil {
			return err
		}
	}
	return nil
}

// recv receives b from peer: the header if not yet received, then b in
// chunks.
func (o *opState) recv(ctx context.Context, peer int, b Buffer) error {
	if err := o.recvHeader(ctx, peer); err != nil {
		return err
	}
	n := o.chunkLen(b.dt)
	for lo := 0; lo < b.Len(); lo += n {
		if err := o.recvRaw(ctx, peer, b.Slice(lo, min(lo+n, b.Len()))); err != nil {
			return err
		}
	}
	return nil
}

// exchange sends out to peer while receiving in from it: both at once, so
// that two ranks exchanging never wait for each other. When the link takes
// all of out without waiting (a small message into a shared-memory ring),
// it sends and then receives on this goroutine: no hand-off on the
// latency path.
func (o *opState) exchange(peer int, out, in Buffer) error {
	if r, ok := o.c.conns[peer].(sendRoomer); ok && o.wireBytes(peer, out) <= r.SendRoom() {
		if err := o.send(o.ctx, peer, out); err != nil {
			return err
		}
		return o.recv(o.ctx, peer, in)
	}
	return par(o.ctx,
		func(ctx context.Context) error { return o.recv(ctx, peer, in) },
		func(ctx context.Context) error { return o.send(ctx, peer, out) })
}

// sendRoomer is a link that tells how much it can take without waiting.
type sendRoomer interface{ SendRoom() int }

// wireBytes bounds how many bytes o.send(peer, b) puts on the link,
// counting 16 per message for its length and padding.
func (o *opState) wireBytes(peer int, b Buffer) int {
	n := len(b.b)
	if !o.c.sent[peer] {
		n += 16 + hdrSize
	}
	if len(b.b) > 0 {
		n += 16 * ((b.Len() + o.chunkLen(b.dt) - 1) / o.chunkLen(b.dt))
	}
	return n
}

// Scratch slots: each operation uses at most one buffer per slot.
const (
	slotTmp  = iota // receive buffer
	slotWork        // partial results (tree, reduce-scatter)
	slotCopy        // a working copy of the caller's data
	numSlots
)

// maxKeptScratch is the largest scratch buffer kept between operations.
const maxKeptScratch = 64 << 20

// scratch returns n elements of dt from slot, reused across operations
// (they execute one at a time) and 8-byte aligned.
func (o *opState) scratch(slot int, dt DType, n int) Buffer {
	need := n * dt.Size()
	s := o.c.scratch[slot]
	if 8*len(s) < need {
		s = make([]uint64, (need+7)/8)
		o.c.scratch[slot] = s
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s))
	return Buffer{b: b[:need:need], dt: dt}
}

func (o *opState) release() {
	for i, s := range o.c.scratch {
		if 8*len(s) > maxKeptScratch {
			o.c.scratch[i] = nil
		}
	}
}

// par runs fns concurrently (the first on the calling goroutine). The first
// error cancels the context the others run with; of all the errors, par
// returns the most telling (see blame), which is usually the first.
func par(ctx context.Context, fns ...func(context.Context) error) error {
	switch len(fns) {
	case 0:
		return nil
	case 1:
		return fns[0](ctx)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu   sync.Mutex
		best error
		wg   sync.WaitGroup
	)
	fail := func(err error) {
		if err == nil {
			return
		}
		mu.Lock()
		if best == nil || blame(err) < blame(best) {
			best = err
		}
		mu.Unlock()
		cancel(err)
	}
	for _, f := range fns[1:] {
		wg.Go(func() { fail(f(ctx)) })
	}
	fail(fns[0](ctx))
	wg.Wait()
	return best
}

// blame orders errors by how well they explain a failure, lowest first: a
// mismatch; a peer that never joined the call before the timeout; a link
// that failed; a peer that stalled mid-call (often only because it waits
// for another); a cancellation (usually our own, after another error).
func blame(err error) int {
	var me *MismatchError
	var te timeoutError
	switch {
	case errors.As(err, &me):
		return 0
	case errors.As(err, &te) && te.joining:
		return 1
	case errors.As(err, &te):
		return 3
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return 4
	}
	return 2
}

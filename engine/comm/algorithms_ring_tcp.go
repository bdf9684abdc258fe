package comm

// The ring over TCP on one goroutine: when both ring neighbours are
// single-connection TCP links, the ring schedule runs as one pass of
// tcp_pass.go's engine over both sockets: the header and every chunk
// whose data is in go out, several in one writev, and a received chunk
// is reduced as soon as it is in. The wire format and the schedule are those of
// the two-goroutine ring (algorithms_ring.go), so ranks on either path
// interoperate.

// ringLinks returns the links of the ring pass when both are TCP links of
// one connection (striped links keep the two-goroutine ring).
func (o *opState) ringLinks() (in, out *tcpConn, ok bool) {
	p, r := o.c.size, o.c.rank
	in, ok1 := o.tcpLink(mod(r-1, p))
	out, ok2 := o.tcpLink(mod(r+1, p))
	return in, out, ok1 && ok2
}

// ringTCP runs the pass rp over in (from the left) and out (to the right).
func (o *opState) ringTCP(rp *ringPass, in, out *tcpConn) error {
	p, r := o.c.size, o.c.rank
	t := o.newTCPPass(mod(r-1, p), mod(r+1, p), in, out)
	t.op = rp.op
	if rp.own.b != nil {
		t.fillDst, t.fillSrc = rp.local(r).b, rp.own.b
	}
	t.header()
	// The header goes at once, the first step's chunks as the window
	// allows, a later chunk once the chunk it forwards is in
	// (tcpPass.sendable).
	t.nFirst, t.gated = ringPlan(t, rp), true
	t.window = max(2, tcpRingWindow/max(1, o.chunkLen(rp.dt)*rp.dt.Size()))
	return t.run()
}

// tcpRingWindow is how many bytes of the ring's first step a rank sends
// ahead of what it has received. Every chunk of the first step may go at
// once, and did until 2026-11-27; with a 2-rank reduce-scatter or
// all-gather that is the whole call's data, written into the peer's
// socket faster than the peer reads it. Between two hosts of one core
// each, whole runs of such calls of 8-64 MiB then took 3-4x longer, each
// rank busy in the kernel throughout; with 1 MiB ahead no run did
// (docs/benchmarks.md, "Socket buffers"). A rank always has its first
// two chunks to send, and each chunk received lets one more go, so no
// ring waits on itself: each rank's peer before it sends as much as it
// has received, and window more.
const tcpRingWindow = 1 << 20

// ringPlan lists the chunks of the pass, in the order of the
// two-goroutine ring, and returns how many chunks wait for no receive.
func ringPlan(t *tcpPass, rp *ringPass) (nFirst int) {
	o := t.o
	p, r := o.c.size, o.c.rank
	n := o.chunkLen(rp.dt)
	tmp := o.scratch(slotTmp, rp.dt, n)
	for s := rp.first; s <= rp.last; s++ {
		src := rp.src(s, mod(r-s-1, p))
		if s == rp.first && rp.own.b != nil {
			src = rp.own // block r, put in place by the pass (tcpPass.fill)
		}
		for lo := 0; lo < src.Len(); lo += n {
			t.sends = append(t.sends, src.Slice(lo, min(lo+n, src.Len())).b)
			if s == rp.first {
				nFirst++
			}
		}
		b := mod(r-s-2, p)
		dst := rp.dst(s, b)
		reducing := s < p-1
		for lo := 0; lo < dst.Len(); lo += n {
			hi := min(lo+n, dst.Len())
			it := tcpRecvItem{dst: dst.Slice(lo, hi)}
			if reducing {
				it.local, it.t, it.reduce = rp.local(b).Slice(lo, hi), tmp.Slice(0, hi-lo), true
				it.avg = rp.avg && s == p-2
			}
			t.recvs = append(t.recvs, it)
		}
	}
	return nFirst
}

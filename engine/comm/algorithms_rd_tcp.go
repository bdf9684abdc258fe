package comm

// Recursive doubling's exchanges over TCP on one goroutine. An exchange
// with a single-connection TCP peer is one pass of tcp_pass.go's engine:
// the whole buffer goes out chunk by chunk at once, the peer's comes in
// into a buffer of its own, and each chunk is reduced into place as soon
// as it is in and its own bytes have gone out, so both directions of the
// link and the reduction overlap. For 2 ranks this moves the bytes of the
// ring's reduce-scatter and all-gather (n each way) in one step with no
// dependency between them: the ring's all-gather chunk waits for the
// reduce-scatter chunk it forwards, which with the default 256 KiB chunks
// serialises a 512 KiB all-reduce into two round trips. The wire format
// is that of exchange (the header once, then the buffer in chunks of
// Options.ChunkBytes), so a rank on either path interoperates.

// tcpLink returns the link to peer when it is a TCP link of one
// connection, on a descriptor of its own (tcp_fd.go); a striped one keeps
// the two-goroutine algorithms.
func (o *opState) tcpLink(peer int) (*tcpConn, bool) {
	l, ok := o.c.conns[peer].(*tcpConn)
	if !ok || l.sock < 0 {
		return nil, false
	}
	return l, true
}

// exchangeReduce sends buf to peer while receiving the peer's into tmp,
// and leaves buf ⊕ tmp in buf (tmp ⊕ buf when lowFirst is false: both
// partners combine the lower group's data first, so that they get the
// same bits).
func (o *opState) exchangeReduce(peer int, buf, tmp Buffer, op Op, lowFirst bool) error {
	l, ok := o.tcpLink(peer)
	if !ok {
		if err := o.exchange(peer, buf, tmp); err != nil {
			return err
		}
		if lowFirst {
			reduceInto(op, buf, buf, tmp)
		} else {
			reduceInto(op, buf, tmp, buf)
		}
		return nil
	}
	t := o.newTCPPass(peer, peer, l, l)
	t.op, t.ownTmp = op, true
	t.header()
	n := o.chunkLen(buf.dt)
	wAt := int64(0) // bytes sent before the chunk's payload
	if t.hdrOut {
		wAt = 8 + hdrSize
	}
	for lo := 0; lo < buf.Len(); lo += n {
		hi := min(lo+n, buf.Len())
		chunk := buf.Slice(lo, hi)
		wAt += 8
		t.sends = append(t.sends, chunk.b)
		t.recvs = append(t.recvs, tcpRecvItem{dst: chunk, local: chunk, t: tmp.Slice(lo, hi),
			reduce: true, swap: !lowFirst, guard: true, wAt: wAt})
		wAt += int64(len(chunk.b))
	}
	return t.run()
}

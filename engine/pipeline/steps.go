package pipeline

import "fmt"

// Transfer is one point-to-point message: the activation (Pass Forward)
// that virtual stage Stage's forward of micro-batch Micro passes to stage
// Stage+1, or the gradient (Pass Backward) its backward passes to stage
// Stage−1. Peer is the rank at the other end.
type Transfer struct {
	Pass  Pass
	Micro int
	Stage int // the virtual stage that produced it
	Peer  int // the rank it goes to (a send) or comes from (a receive)
}

// String is e.g. "F3@1→2": micro-batch 3's activation from virtual stage 1,
// the rank at the other end being 2.
func (t Transfer) String() string {
	return fmt.Sprintf("%s%d@%d→%d", t.Pass, t.Micro, t.Stage, t.Peer)
}

// msg identifies a transfer on both ends: pass, micro-batch, producer.
type msg struct{ pass, micro, stage int }

func (t *Transfer) key() msg { return msg{int(t.Pass), t.Micro, t.Stage} }

// Step is one thing a rank does, in order: either one communicator
// operation (Send and/or Recv set: a Send, a Recv or a SendRecv of the
// pipeline group) or one operation (Op set). A Send follows the operation
// whose output it carries; a Recv precedes the operation that consumes it.
type Step struct {
	Send, Recv *Transfer
	Op         *Op
}

// Steps returns rank's operations with the transfers they need, in the
// order Run issues them (see the package doc for why this order). s must
// be valid and rank in [0, Stages).
func (s Schedule) Steps(rank int) []Step {
	if s.Kind == Interleaved {
		return s.interleavedSteps(rank)
	}
	ops := s.Ops(rank)
	b := stepBuilder{s: s, steps: make([]Step, 0, 2*len(ops)+1)}
	var prev *Op
	for i := range ops {
		b.comm(s.output(prev), s.input(&ops[i]))
		b.compute(ops[i])
		prev = &ops[i]
	}
	b.comm(s.output(prev), nil)
	return b.steps
}

// interleavedSteps places the transfers as Megatron-LM's interleaved
// schedule does: each warm-up forward sends its output with the next
// forward's input received; each steady-state pair of a forward and a
// backward is followed by two exchanges, first the activations (output
// sent to the next rank, the next forward's input received from the
// previous one: every rank shifts the same way at once), then the
// gradients (the other way, the next backward's gradient received
// already: a backward never waits behind a forward's transfer); each
// cool-down backward sends its gradient with the next one's received.
// Megatron-LM batches each pair of exchanges into one operation; two
// SendRecvs in a fixed order do the same on a communicator that runs one
// operation at a time.
func (s Schedule) interleavedSteps(rank int) []Step {
	total, w := s.Micros*s.Chunks, s.Warmup(rank)
	fwd := func(k int) *Op { op := s.op(rank, Forward, k); return &op }
	bwd := func(k int) *Op { op := s.op(rank, Backward, k); return &op }
	b := stepBuilder{s: s, steps: make([]Step, 0, 6*total)}
	b.comm(nil, s.input(fwd(0)))
	for k := range w {
		b.compute(*fwd(k))
		b.comm(s.output(fwd(k)), b.inputOf(fwd, k+1, total))
	}
	b.comm(nil, s.input(bwd(0)))
	for k := range total - w {
		f, g := fwd(w+k), bwd(k)
		b.compute(*f)
		b.compute(*g)
		b.comm(s.output(f), b.inputOf(fwd, w+k+1, total))
		b.comm(s.output(g), b.inputOf(bwd, k+1, total))
	}
	for k := total - w; k < total; k++ {
		b.compute(*bwd(k))
		b.comm(s.output(bwd(k)), b.inputOf(bwd, k+1, total))
	}
	return b.steps
}

type stepBuilder struct {
	s     Schedule
	steps []Step
}

// comm appends a communicator operation, if there is anything to move.
func (b *stepBuilder) comm(send, recv *Transfer) {
	if send != nil || recv != nil {
		b.steps = append(b.steps, Step{Send: send, Recv: recv})
	}
}

func (b *stepBuilder) compute(op Op) { b.steps = append(b.steps, Step{Op: &op}) }

// inputOf is the input of the k-th operation made by op, none past total.
func (b *stepBuilder) inputOf(op func(int) *Op, k, total int) *Transfer {
	if k >= total {
		return nil
	}
	return b.s.input(op(k))
}

// output is what op sends, or nil: the last virtual stage's forward and
// the first one's backward send nothing.
func (s Schedule) output(op *Op) *Transfer {
	next := s.next(op)
	if op == nil || next < 0 || next >= s.VirtualStages() {
		return nil
	}
	return &Transfer{Pass: op.Pass, Micro: op.Micro, Stage: op.Stage, Peer: next % s.Stages}
}

// input is what op receives, or nil: the first virtual stage's forward
// reads the data, the last one's backward starts from the loss.
func (s Schedule) input(op *Op) *Transfer {
	from := 2*op.Stage - s.next(op) // the stage on the other side
	if from < 0 || from >= s.VirtualStages() {
		return nil
	}
	return &Transfer{Pass: op.Pass, Micro: op.Micro, Stage: from, Peer: from % s.Stages}
}

// next is the virtual stage op's output goes to (maybe out of range).
func (s Schedule) next(op *Op) int {
	if op == nil {
		return -1
	}
	if op.Pass == Forward {
		return op.Stage + 1
	}
	return op.Stage - 1
}

package pipeline

import (
	"fmt"
	"math"
)

// simulate runs every rank's steps as Run does, on a model of the
// strictest link (comm's in-process transport): a transfer happens only
// when the sender's and the receiver's communicator operations are both
// under way, and each rank runs its communicator operations one at a
// time, in the order issued. A rank issues step k's transfer when its
// operation k−1 ends and starts operation k when the transfer carrying
// its input has completed. Forwards of a chunk take fwd, backwards bwd;
// transfers take no time. It returns when the last operation ends, or an
// error when the ranks wait for each other forever or a received transfer
// is not the one its sender sent.
func simulate(s Schedule, steps [][]Step, fwd, bwd float64) (float64, error) {
	sims := make([]*simRank, len(steps))
	for r := range steps {
		var err error
		if sims[r], err = newSimRank(s, steps[r]); err != nil {
			return 0, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if err := matchTransfers(sims); err != nil {
		return 0, err
	}
	var end float64
	for {
		progress := false
		done := true
		for _, sr := range sims {
			progress = sr.compute(fwd, bwd) || progress
			done = done && sr.pc == len(sr.steps)
		}
		for r, sr := range sims {
			progress = sr.communicate(r, sims) || progress
		}
		if done && allComms(sims) {
			break
		}
		if !progress {
			return 0, fmt.Errorf("deadlock: %s", describeStuck(sims))
		}
	}
	for _, sr := range sims {
		end = math.Max(end, sr.clock)
	}
	return end, nil
}

// simComm is one communicator operation of a simulated rank.
type simComm struct {
	step          int // index in the rank's steps
	issued        bool
	issue, start  float64
	started, done bool
	end           float64
	partners      []simPart // the other end of each transfer
}

type simPart struct{ rank, comm int }

type simRank struct {
	steps  []Step
	comms  []*simComm
	byStep map[int]int // step index → comm index
	inputs map[int]int // operation's step index → comm receiving its input
	pc     int         // next step to run
	clock  float64     // when the last operation ended
	head   int         // the comm operation under way (or next)
}

// newSimRank indexes a rank's steps, checking that each is an operation or
// a transfer, that every operation's input is received before it, and
// that every output is sent after the operation that makes it, once.
func newSimRank(s Schedule, steps []Step) (*simRank, error) {
	sr := &simRank{steps: steps, byStep: map[int]int{}, inputs: map[int]int{}}
	recvd := map[msg]int{} // transfer → comm index
	made := map[msg]bool{} // outputs made and not yet sent
	for i, st := range steps {
		if st.Op != nil {
			if st.Send != nil || st.Recv != nil {
				return nil, fmt.Errorf("step %d: an operation and a transfer at once", i)
			}
			if in := s.input(st.Op); in != nil {
				ci, ok := recvd[in.key()]
				if !ok {
					return nil, fmt.Errorf("step %d: %s runs before receiving %s", i, st.Op, in)
				}
				sr.inputs[i] = ci
				delete(recvd, in.key())
			}
			if out := s.output(st.Op); out != nil {
				made[out.key()] = true
			}
			continue
		}
		if st.Send == nil && st.Recv == nil {
			return nil, fmt.Errorf("step %d: empty", i)
		}
		if st.Send != nil {
			if !made[st.Send.key()] {
				return nil, fmt.Errorf("step %d: sends %s, not made before or sent already", i, st.Send)
			}
			delete(made, st.Send.key())
		}
		if st.Recv != nil {
			recvd[st.Recv.key()] = len(sr.comms)
		}
		sr.byStep[i] = len(sr.comms)
		sr.comms = append(sr.comms, &simComm{step: i})
	}
	if len(made) > 0 || len(recvd) > 0 {
		return nil, fmt.Errorf("%d outputs never sent, %d inputs never used", len(made), len(recvd))
	}
	return sr, nil
}

// compute advances the rank through its steps as far as it can.
func (sr *simRank) compute(fwd, bwd float64) bool {
	progress := false
	for sr.pc < len(sr.steps) {
		st := sr.steps[sr.pc]
		if st.Op == nil {
			c := sr.comms[sr.byStep[sr.pc]]
			c.issued, c.issue = true, sr.clock
			sr.pc++
			progress = true
			continue
		}
		start := sr.clock
		if ci, ok := sr.inputs[sr.pc]; ok {
			c := sr.comms[ci]
			if !c.done {
				return progress
			}
			start = math.Max(start, c.end)
		}
		d := fwd
		if st.Op.Pass == Backward {
			d = bwd
		}
		sr.clock = start + d
		sr.pc++
		progress = true
	}
	return progress
}

// communicate starts the rank's next communicator operation and completes
// it once every transfer in it has its other end under way.
func (sr *simRank) communicate(r int, sims []*simRank) bool {
	progress := false
	for sr.head < len(sr.comms) {
		c := sr.comms[sr.head]
		if !c.issued {
			return progress
		}
		if !c.started {
			c.started, c.start = true, c.issue
			if sr.head > 0 {
				c.start = math.Max(c.start, sr.comms[sr.head-1].end)
			}
			progress = true
		}
		end := c.start
		for _, pt := range c.partners {
			o := sims[pt.rank].comms[pt.comm]
			if !o.started {
				return progress
			}
			end = math.Max(end, o.start)
		}
		c.done, c.end = true, end
		sr.head++
		progress = true
	}
	return progress
}

func allComms(sims []*simRank) bool {
	for _, sr := range sims {
		if sr.head < len(sr.comms) {
			return false
		}
	}
	return true
}

// matchTransfers pairs the k-th send from a to b with the k-th receive by b
// from a (comm's rule), and checks that they describe the same message.
func matchTransfers(sims []*simRank) error {
	type end struct {
		t    Transfer
		rank int
		comm int
	}
	sends, recvs := map[[2]int][]end{}, map[[2]int][]end{}
	for r, sr := range sims {
		for ci, c := range sr.comms {
			st := sr.steps[c.step]
			if st.Send != nil {
				k := [2]int{r, st.Send.Peer}
				sends[k] = append(sends[k], end{*st.Send, r, ci})
			}
			if st.Recv != nil {
				k := [2]int{st.Recv.Peer, r}
				recvs[k] = append(recvs[k], end{*st.Recv, r, ci})
			}
		}
	}
	for k, ss := range sends {
		rs := recvs[k]
		if len(rs) != len(ss) {
			return fmt.Errorf("rank %d sends %d messages to rank %d, which receives %d", k[0], len(ss), k[1], len(rs))
		}
		for i, se := range ss {
			re := rs[i]
			if se.t.Pass != re.t.Pass || se.t.Micro != re.t.Micro || se.t.Stage != re.t.Stage {
				return fmt.Errorf("message %d from rank %d to %d: sent %s, received as %s", i, k[0], k[1], se.t, re.t)
			}
			sims[se.rank].comms[se.comm].partners = append(sims[se.rank].comms[se.comm].partners, simPart{re.rank, re.comm})
			sims[re.rank].comms[re.comm].partners = append(sims[re.rank].comms[re.comm].partners, simPart{se.rank, se.comm})
		}
	}
	for k, rs := range recvs {
		if len(sends[k]) == 0 {
			return fmt.Errorf("rank %d receives %d messages from rank %d, which sends none", k[1], len(rs), k[0])
		}
	}
	return nil
}

func describeStuck(sims []*simRank) string {
	s := ""
	for r, sr := range sims {
		s += fmt.Sprintf(" rank %d at step %d/%d", r, sr.pc, len(sr.steps))
		if sr.head < len(sr.comms) {
			st := sr.steps[sr.comms[sr.head].step]
			s += fmt.Sprintf(" (in comm send %v recv %v)", st.Send, st.Recv)
		}
		s += ";"
	}
	return s
}

package comm

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gtrain/gtrain/internal/flightrec"
)

// The flight recorder. Every communicator keeps its last flightOps
// operations in a fixed ring (what, which sequence number, how many bytes,
// which peer it waits on, when, how it ended), so that a rank asked why it
// hangs can say where it is (FlightRecords, internal/flightrec). Recording
// costs two clock reads and two uncontended locks per operation and no
// allocation: the ring is part of the Communicator, its strings constants.

// flightOps is how many operations a communicator keeps in its ring.
const flightOps = 64

// flightEntry is one recorded operation.
type flightEntry struct {
	name       string
	seq        uint64
	p2p        bool
	to, from   int32
	dt         DType
	count      int64
	bytes      int64
	state      flightrec.State
	waiting    int32 // when ended: the peer it waited on last
	start, end time.Time
	err        string
}

// flightRecorder is a communicator's ring. The executing operation writes
// it; FlightRecords reads it from any goroutine (a signal handler's).
type flightRecorder struct {
	mu    sync.Mutex
	name  string
	world []int // group rank → world rank; nil: the identity
	rank  int
	ring  [flightOps]flightEntry
	n     uint64 // operations recorded so far
	// waiting is the peer the executing operation waits on now, -1 if
	// none: atomic, since the parallel halves of an exchange set it.
	waiting atomic.Int32
}

// begin records the start of cl and returns its id for end.
func (f *flightRecorder) begin(cl *call, elemSize int) uint64 {
	now := time.Now()
	f.waiting.Store(-1)
	f.mu.Lock()
	id := f.n
	f.n++
	to, from := int32(-1), int32(-1)
	if cl.p2p {
		to, from = int32(cl.to), int32(cl.from)
	}
	f.ring[id%flightOps] = flightEntry{name: cl.name, seq: cl.seq, p2p: cl.p2p, to: to, from: from,
		dt: cl.dt, count: int64(cl.count), bytes: int64(cl.count) * int64(elemSize),
		state: flightrec.Pending, waiting: -1, start: now}
	f.mu.Unlock()
	return id
}

// end records how operation id ended.
func (f *flightRecorder) end(id uint64, err error) {
	now := time.Now()
	state, text := flightrec.Done, ""
	if err != nil {
		state, text = flightrec.Failed, err.Error()
		if len(text) > flightrec.MaxErrorText {
			text = text[:flightrec.MaxErrorText-len("…")] + "…"
		}
	}
	f.mu.Lock()
	if f.n-id <= flightOps {
		e := &f.ring[id%flightOps]
		e.end, e.state, e.err, e.waiting = now, state, text, f.waiting.Load()
	}
	f.mu.Unlock()
}

// wait notes that the executing operation now waits on peer.
func (f *flightRecorder) wait(peer int) { f.waiting.Store(int32(peer)) }

// snapshot returns the ring as a flight record group, oldest first.
func (f *flightRecorder) snapshot() flightrec.Group {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := flightrec.Group{Name: nameOr(f.name), Rank: f.rank, Ranks: slices.Clone(f.world)}
	first := f.n - min(f.n, flightOps)
	g.Dropped = first
	for id := first; id < f.n; id++ {
		e := &f.ring[id%flightOps]
		op := flightrec.Op{Op: e.name, Seq: e.seq, P2P: e.p2p, To: int(e.to), From: int(e.from),
			Count: e.count, Bytes: e.bytes, State: e.state, Waiting: int(e.waiting),
			Start: e.start, End: e.end, Error: e.err}
		if e.dt.Size() > 0 {
			op.DType = e.dt.String()
		}
		if e.state == flightrec.Pending {
			op.Waiting = int(f.waiting.Load())
		}
		g.Ops = append(g.Ops, op)
	}
	return g
}

// blocked is the time this process's callers have spent blocked in
// operations (BlockedTime).
var blocked atomic.Int64

func countBlocked(since time.Time) { blocked.Add(int64(time.Since(since))) }

// BlockedTime returns how long the callers of this process's communicators
// have been blocked in their operations, in total: the blocking calls and
// Handle.Wait, not the asynchronous operations that ran while the caller
// computed. A step's time less its growth is the rank's own work, which
// tells a straggler from the ranks that wait for it (in a synchronous job
// every rank's step takes the same time). A process of one rank is
// assumed: in-process tests share the count.
func BlockedTime() time.Duration { return time.Duration(blocked.Load()) }

// live holds the open communicators of this process, for FlightRecords.
var live struct {
	sync.Mutex
	comms map[*Communicator]struct{}
}

// register adds c, fully built, to the communicators FlightRecords reports.
func (c *Communicator) register() {
	f := &c.flight
	f.mu.Lock()
	f.name, f.rank = c.opts.Name, c.rank
	f.world = make([]int, c.size)
	for r := range f.world {
		f.world[r] = c.WorldRank(r)
	}
	f.mu.Unlock()
	live.Lock()
	if live.comms == nil {
		live.comms = map[*Communicator]struct{}{}
	}
	live.comms[c] = struct{}{}
	live.Unlock()
}

func (c *Communicator) unregister() {
	live.Lock()
	delete(live.comms, c)
	live.Unlock()
}

// FlightRecord returns the communicator's record of its last operations.
func (c *Communicator) FlightRecord() flightrec.Group { return c.flight.snapshot() }

// FlightRecords returns the record of every communicator of this process
// not yet closed (an aborted one included), ordered by name: what a rank
// writes when asked why it hangs. It is safe to call at any time.
func FlightRecords() []flightrec.Group {
	live.Lock()
	comms := make([]*Communicator, 0, len(live.comms))
	for c := range live.comms {
		comms = append(comms, c)
	}
	live.Unlock()
	out := make([]flightrec.Group, 0, len(comms))
	for _, c := range comms {
		out = append(out, c.FlightRecord())
	}
	slices.SortFunc(out, func(a, b flightrec.Group) int {
		if a.Name != b.Name {
			return cmp.Compare(a.Name, b.Name)
		}
		return slices.Compare(a.Ranks, b.Ranks)
	})
	return out
}

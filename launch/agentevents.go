package launch

import (
	"sync"

	"github.com/gtrain/gtrain/launch/proto"
)

// eventQueue is how many events may wait for the agent's writer before
// their emitters block: a rank writing faster than the launcher reads is
// slowed down (its pipe fills), never dropped.
const eventQueue = 16

// eventWriter writes an agent's events on one goroutine, in the order they
// were emitted, except heartbeats, which go ahead of every queued event: a
// rank flooding its output must not hold back the sign of life the
// launcher counts silence by. Heartbeats carry nothing else, so moving
// them ahead reorders nothing that matters; every other event (a rank's
// last lines before its exit, for one) keeps its order.
type eventWriter struct {
	enc   *proto.Encoder
	queue chan queued
	beat  chan proto.Event // at most one heartbeat waits; a newer one is redundant
	done  chan struct{}    // closed when the writer has stopped
	once  sync.Once
}

// queued is an event, or (flushed set) the request to stop once every
// event before it is written.
type queued struct {
	ev      proto.Event
	flushed chan struct{}
}

func newEventWriter(enc *proto.Encoder) *eventWriter {
	w := &eventWriter{enc: enc, queue: make(chan queued, eventQueue), beat: make(chan proto.Event, 1), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *eventWriter) run() {
	defer close(w.done)
	for {
		select {
		case ev := <-w.beat:
			w.write(ev)
			continue
		default:
		}
		select {
		case ev := <-w.beat:
			w.write(ev)
		case q := <-w.queue:
			if q.flushed != nil {
				close(q.flushed)
				return
			}
			w.write(q.ev)
		}
	}
}

// write encodes one event. A write error means the launcher is gone; the
// agent's stdin reaches end of file and stops it.
func (w *eventWriter) write(ev proto.Event) { _ = w.enc.Encode(ev) }

// send queues ev; once the writer has stopped it writes ev itself, so a
// straggler is neither lost nor blocked for ever.
func (w *eventWriter) send(ev proto.Event) {
	if ev.Type == proto.EventHeartbeat {
		select {
		case w.beat <- ev:
		case <-w.done:
			w.write(ev)
		default: // one is already waiting
		}
		return
	}
	select {
	case w.queue <- queued{ev: ev}:
	case <-w.done:
		w.write(ev)
	}
}

// close writes every queued event, then stops the writer.
func (w *eventWriter) close() {
	w.once.Do(func() {
		f := make(chan struct{})
		select {
		case w.queue <- queued{flushed: f}:
			<-f
		case <-w.done:
		}
	})
}

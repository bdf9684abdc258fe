package launch

import (
	"sync/atomic"
	"time"
)

// agentLife is what the reader of one agent's events knows of its life,
// kept apart from the launcher's loop: when the loop is held up (a slow
// view, a terminal paused with Ctrl-S), the events wait in its queue, and
// an agent whose events are waiting is not silent.
type agentLife struct {
	heard   atomic.Int64 // unix nanoseconds when the last event arrived
	waiting atomic.Bool  // the reader holds an event the loop has not taken
	ended   atomic.Bool  // the stream ended: the loop judges the agent by its end
}

// read forwards node i's events to msgs until its stream ends.
func (l *agentLife) read(c AgentConn, i int, msgs chan<- agentMsg) {
	for {
		ev, err := c.Recv()
		m := agentMsg{node: i, ev: ev}
		if err != nil {
			m = agentMsg{node: i, err: err, end: true}
			l.ended.Store(true)
		}
		l.heard.Store(time.Now().UnixNano())
		l.waiting.Store(true)
		msgs <- m
		l.waiting.Store(false)
		if err != nil {
			return
		}
	}
}

// alive reports whether the agent was heard within limit of now, or has an
// event the loop has yet to take, or its stream ended (the end, queued
// behind other events, says whether it finished or was lost).
func (l *agentLife) alive(now time.Time, limit time.Duration) bool {
	if l.waiting.Load() || l.ended.Load() {
		return true
	}
	heard := l.heard.Load()
	return heard != 0 && now.Sub(time.Unix(0, heard)) < limit
}

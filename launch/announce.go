package launch

import (
	"fmt"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
)

// announceAttempt tells the views that attempt n of p begins: an attempt
// event with its world, so that the live table and the exporter show the
// ranks of this attempt, not those of the one before (an elastic restart
// may run fewer or more).
func announceAttempt(v eventSink, n int, p *Job) {
	v.Event(proto.Event{V: proto.Version, Type: proto.EventAttempt, Time: time.Now(), Node: -1, Rank: -1,
		Attempt: n, World: len(p.Ranks), Message: fmt.Sprintf("attempt %d: %d ranks on %d hosts", n, len(p.Ranks), len(p.Hosts))})
}

// announceLost tells the views which hosts the attempt lost with e, a
// host_lost event each (every host a join timeout names): the exporter's
// gtrain_host_lost_total counts them, elastic job or not. agentLost calls
// it once per host and attempt.
func (a *attempt) announceLost(e *AgentLostError) {
	nodes := []int{e.Node}
	if e.Node < 0 {
		nodes = a.missing
	}
	why := "lost"
	if e.Err != nil {
		why = e.Err.Error()
	}
	for _, n := range nodes {
		if n >= 0 && n < len(a.p.Hosts) {
			a.view.Event(proto.Event{V: proto.Version, Type: proto.EventHostLost, Time: time.Now(),
				Host: a.p.Hosts[n].Name, Node: n, Rank: -1, Message: why})
		}
	}
}

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

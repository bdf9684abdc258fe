package launch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
)

// One attempt of per-node mode as this node sees it. Its own agent runs
// here (Local); every other node is a peerConn, an AgentConn whose events
// come from the job's store under pernode/N/:
//
//	beat/NAME   a counter each node's launcher adds to every heartbeat
//	done        a bit per node in rank order, set once its agent said done
//	stop        the first reason the attempt is going down (nodeStop)
//
// Each node watches the beat of the next node in rank order that is not
// done (a ring: every node is watched, and the store answers O(nodes)
// requests a beat, not O(nodes²)); a node whose beat stands still for
// SilentAfter is lost, and its watcher writes stop blaming it. Every node
// waits for stop, so a failure anywhere stops every node at once.
//
// A store that does not answer judges nobody (etcd restarting must not
// stop the job), but only for storeOutage: past that, a node cannot learn
// whether the others are alive, done or failed, and would wait for them
// for ever once its own ranks are done, so it stops, naming the store.

// nodeStop is the value of an attempt's stop key.
type nodeStop struct {
	By     string `json:"by"`     // the node that wrote it
	Node   string `json:"node"`   // the node to blame
	Reason string `json:"reason"` // why
	Final  bool   `json:"final"`  // its writer leaves the job: no restart
}

// nodeAttempt is this node's side of attempt n of a per-node job.
type nodeAttempt struct {
	pn      *perNode
	n       int
	me      int
	members []nodeInfo
	beat    time.Duration
	ctx     context.Context // the attempt's: ends when Run's loop is over
	cancel  context.CancelFunc

	mu      sync.Mutex
	peers   []*peerConn // by node; nil for this one
	stop    *nodeStop   // once known
	final   bool        // a node left the job in this attempt
	lostErr error       // the store's outage, when it stopped the attempt
	failing time.Time   // the first failed store request since one answered
}

func newNodeAttempt(ctx context.Context, pn *perNode, n, me int, members []nodeInfo, beat time.Duration) *nodeAttempt {
	na := &nodeAttempt{pn: pn, n: n, me: me, members: members, beat: beat, peers: make([]*peerConn, len(members))}
	na.ctx, na.cancel = context.WithCancel(ctx)
	return na
}

func (na *nodeAttempt) key(k string) string { return roundKey(na.n, k) }
func (na *nodeAttempt) name(i int) string   { return na.members[i].Name }

// run beats, watches the ring and waits for the stop key until the
// attempt's context ends.
func (na *nodeAttempt) run() {
	go na.beatLoop()
	go na.watchRing()
	go na.waitStop()
}

// beatLoop adds to this node's beat counter every heartbeat. A request
// that fails (etcd restarting) is skipped: the watchers allow for it.
func (na *nodeAttempt) beatLoop() {
	t := time.NewTicker(na.beat)
	defer t.Stop()
	k := na.key("beat/" + na.name(na.me))
	for {
		ctx, cancel := context.WithTimeout(na.ctx, na.beat)
		_, err := na.pn.store.Add(ctx, k, 1)
		cancel()
		na.answered(err)
		select {
		case <-t.C:
		case <-na.ctx.Done():
			return
		}
	}
}

// counter reads a counter of the store without changing it.
func (na *nodeAttempt) counter(k string) (int64, error) {
	ctx, cancel := context.WithTimeout(na.ctx, na.beat)
	defer cancel()
	v, err := na.pn.store.Add(ctx, k, 0)
	na.answered(err)
	return v, err
}

// watchRing watches the next node that is not done, as checkSilent
// watches agents: a check held up (this process, or the store, was slow
// or away) judges nobody and starts the count again.
func (na *nodeAttempt) watchRing() {
	t := time.NewTicker(na.beat)
	defer t.Stop()
	w := beatWatch{limit: SilentAfter(na.beat), last: -1, changed: time.Now()}
	next := na.me
	lastCheck := time.Now()
	for {
		select {
		case <-na.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		held := now.Sub(lastCheck) > 2*na.beat+time.Second
		lastCheck = now
		if next == na.me || na.isDone(next) {
			if next = na.nextWatched(next); next < 0 {
				return // every other node is done
			}
			w.last, w.changed = -1, now
		}
		if na.allDone() {
			return
		}
		v, err := na.counter(na.key("beat/" + na.name(next)))
		at := time.Now()
		if d := na.outage(at); err != nil && d >= storeOutage(na.beat) {
			na.storeLost(d)
			return
		}
		if silent := w.check(v, err, held, at); silent > 0 && !na.isDone(next) {
			na.lost(next, fmt.Sprintf("its gtrain run sent no heartbeat to the rendezvous for %v (it was killed, or its node lost the network)", silent.Round(time.Second)))
			return
		}
	}
}

// nextWatched is the node after from, in rank order, that is not done; -1
// when there is none.
// Each done node found on the way is done for the local attempt too.
func (na *nodeAttempt) nextWatched(from int) int {
	for k := 1; k <= len(na.members); k++ { // from itself last
		i := (from + k) % len(na.members)
		if i == na.me {
			continue
		}
		if !na.isDone(i) {
			return i
		}
		na.endPeer(i, nil)
	}
	return -1
}

// allDone checks every node's done counter: done nodes end as done here.
// A node watching its ring neighbour would learn of the others' end only
// when its neighbour ends, so it also polls the job's done count.
func (na *nodeAttempt) allDone() bool {
	set, err := na.doneSet()
	if err != nil {
		return false
	}
	for i := range na.members {
		if !isSet(set, i) {
			return false
		}
	}
	for i := range na.members {
		na.endPeer(i, nil)
	}
	return true
}

// endPeer ends node i's peer, if it has one.
func (na *nodeAttempt) endPeer(i int, err error) {
	na.mu.Lock()
	p := na.peers[i]
	na.mu.Unlock()
	if p != nil {
		p.end(err)
	}
}

func (na *nodeAttempt) isDone(i int) bool {
	set, err := na.doneSet()
	return err == nil && isSet(set, i)
}

// lost writes the stop blaming node i, and ends its peer.
func (na *nodeAttempt) lost(i int, why string) {
	na.writeStop(nodeStop{By: na.name(na.me), Node: na.name(i), Reason: why})
}

// writeStop records s as the attempt's stop unless one is there already,
// and acts on whichever is.
func (na *nodeAttempt) writeStop(s nodeStop) {
	raw, _ := json.Marshal(s)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(na.ctx), 10*time.Second)
	defer cancel()
	_, cur, err := na.pn.store.CompareAndSet(ctx, na.key("stop"), nil, raw)
	if err == nil && cur != nil {
		_ = json.Unmarshal(cur, &s)
	}
	na.stopped(s)
}

// waitStop waits for any node's stop. A store that fails the wait (the
// c10d host node's connection ended) loses the node that hosted it.
func (na *nodeAttempt) waitStop() {
	v, err := na.pn.store.Get(na.ctx, na.key("stop"))
	if na.ctx.Err() != nil {
		return
	}
	var s nodeStop
	if err == nil {
		err = json.Unmarshal(v, &s)
	}
	if err != nil {
		host := na.storeHost()
		s = nodeStop{By: host, Node: host, Reason: fmt.Sprintf("lost the rendezvous it hosted (%s): %v", na.pn.endpoint, err), Final: true}
	}
	na.stopped(s)
}

// storeHost is the node hosting the c10d store, else this node.
func (na *nodeAttempt) storeHost() string {
	for _, m := range na.members {
		if m.StoreHost {
			return m.Name
		}
	}
	return na.name(na.me)
}

// stopped ends every peer once the attempt's stop is known: the blamed
// node's with the reason (the local attempt fails and tears down), the
// others as done. A stop blaming this node blames its writer here.
func (na *nodeAttempt) stopped(s nodeStop) {
	na.mu.Lock()
	if na.stop != nil {
		na.mu.Unlock()
		return
	}
	na.stop = &s
	na.final = s.Final
	peers := na.peers
	na.mu.Unlock()
	blame := s.Node
	if blame == na.name(na.me) {
		blame = s.By
	}
	for i, p := range peers {
		switch {
		case p == nil:
		case na.name(i) == blame:
			msg := "node " + s.Node + " stopped the job: " + s.Reason
			if s.By != s.Node {
				msg = fmt.Sprintf("node %s stopped the job: node %s: %s", s.By, s.Node, s.Reason)
			}
			p.end(errors.New(msg))
		default:
			p.end(nil)
		}
	}
}

// nodeTransport starts this node's agent with Local and a peerConn for
// every other node.
type nodeTransport struct {
	local Transport
	na    *nodeAttempt
}

// Start implements Transport.
func (t *nodeTransport) Start(ctx context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	na := t.na
	if h.Node == na.me {
		c, err := t.local.Start(ctx, h, asg)
		if err != nil {
			return nil, err
		}
		return &nodeLocalConn{AgentConn: c, na: na}, nil
	}
	p := &peerConn{events: make(chan proto.Event, 4), quit: make(chan struct{}), host: h, beat: na.beat}
	na.mu.Lock()
	na.peers[h.Node] = p
	stop, lost := na.stop, na.lostErr
	na.mu.Unlock()
	p.events <- proto.Event{V: proto.Version, Type: proto.EventJoined, Time: time.Now(), Host: h.Name, Node: h.Node, Rank: -1, Facts: &proto.HostFacts{Hostname: h.Name}}
	go p.beatLoop()
	if stop != nil {
		p.end(lost)
	}
	return p, nil
}

// nodeLocalConn is this node's agent; its done is published for the others,
// and a stop the attempt sends it is the job's stop.
type nodeLocalConn struct {
	AgentConn
	na *nodeAttempt

	mu        sync.Mutex
	failure   string        // its first rank that failed, for the other nodes
	published chan struct{} // once it said done: closed when publishDone returns
}

// Recv implements AgentConn.
func (c *nodeLocalConn) Recv() (proto.Event, error) {
	ev, err := c.AgentConn.Recv()
	switch {
	case err != nil:
	case ev.Type == proto.EventDone:
		c.mu.Lock()
		if c.published == nil {
			ch := make(chan struct{})
			c.published = ch
			go func() { c.na.publishDone(); close(ch) }()
		}
		c.mu.Unlock()
	case ev.Type == proto.EventRankExited && ev.Code != 0 && !ev.Killed:
		c.mu.Lock()
		if c.failure == "" {
			c.failure = fmt.Sprintf("rank %d (local rank %d) exited with code %d", ev.Rank, ev.Local, ev.Code)
		}
		c.mu.Unlock()
	}
	return ev, err
}

// Close implements AgentConn. An agent that said done is closed once its
// done is in the store: the attempt ends (and this node stops beating)
// when its agents are closed, and a node that stops beating before the
// others see it done is judged lost by its watcher.
func (c *nodeLocalConn) Close() error {
	err := c.AgentConn.Close()
	c.mu.Lock()
	published := c.published
	c.mu.Unlock()
	if published != nil {
		<-published
	}
	return err
}

// publishDone tells the other nodes this node is done, trying again until
// the store takes it (etcd may be restarting): they wait for it. It gives
// up after storeOutage of failures, when the others stop by themselves.
func (na *nodeAttempt) publishDone() {
	var failing time.Time
	for {
		ctx, cancel := context.WithTimeout(na.ctx, 10*time.Second)
		err := na.setDone(ctx)
		cancel()
		if err == nil {
			return
		}
		if failing.IsZero() {
			failing = time.Now()
		}
		if time.Since(failing) >= storeOutage(na.beat) || sleepCtx(na.ctx, na.beat) != nil {
			return
		}
	}
}

// Send implements AgentConn: a stop or kill goes to every node.
func (c *nodeLocalConn) Send(cmd proto.Command) error {
	if cmd.Type == proto.CommandStop || cmd.Type == proto.CommandKill {
		na := c.na
		me := na.name(na.me)
		c.mu.Lock()
		reason := cmp.Or(c.failure, cmd.Reason)
		c.mu.Unlock()
		if cmd.Signal != "" {
			reason += " (" + cmd.Signal + ")"
		}
		go na.writeStop(nodeStop{By: me, Node: me, Reason: reason, Final: na.ctx.Err() != nil})
	}
	return c.AgentConn.Send(cmd)
}

// peerConn is another node of the job as this node's attempt sees it: it
// joined (the round said so), beats while the attempt runs, and ends at
// the attempt's stop: done, or with the reason when it is to blame.
type peerConn struct {
	host   Host
	beat   time.Duration
	events chan proto.Event
	once   sync.Once
	quit   chan struct{}
	err    error
}

// beatLoop keeps the local attempt from counting the peer silent: its
// liveness is judged in the store (watchRing).
func (p *peerConn) beatLoop() {
	t := time.NewTicker(p.beat)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
			select {
			case p.events <- proto.Event{V: proto.Version, Type: proto.EventHeartbeat, Time: time.Now(), Host: p.host.Name, Node: p.host.Node, Rank: -1}:
			case <-p.quit:
				return
			}
		}
	}
}

// end ends the peer's stream: with err, or (nil) done.
func (p *peerConn) end(err error) {
	p.once.Do(func() {
		p.err = err
		close(p.quit)
	})
}

// Recv implements AgentConn.
func (p *peerConn) Recv() (proto.Event, error) {
	select {
	case ev := <-p.events:
		return ev, nil
	case <-p.quit:
	}
	select {
	case ev := <-p.events: // the joined event, if the stop came first
		return ev, nil
	default:
	}
	if p.err != nil {
		return proto.Event{}, p.err
	}
	p.err = io.EOF
	return proto.Event{V: proto.Version, Type: proto.EventDone, Time: time.Now(), Host: p.host.Name, Node: p.host.Node, Rank: -1}, nil
}

// Send implements AgentConn; the node hears of a stop through the store.
func (p *peerConn) Send(proto.Command) error { return nil }

// Kill implements AgentConn: the node is not this one's to kill.
func (p *peerConn) Kill() error {
	p.end(errors.New("stopped waiting for node " + p.host.Name))
	return nil
}

// Close implements AgentConn.
func (p *peerConn) Close() error { p.end(nil); return nil }

// Stderr implements AgentConn.
func (p *peerConn) Stderr() string { return "" }

package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// agentMsg is one event, or the end of the stream, from the agent of node.
type agentMsg struct {
	node int
	ev   proto.Event
	err  error // set with end: why the stream ended (io.EOF when cleanly)
	end  bool
}

// agentState is what the launcher knows of one node's agent during an
// attempt.
type agentState struct {
	conn     AgentConn
	done     bool             // the agent said done
	ended    bool             // its event stream has ended
	gone     bool             // reported lost, or killed by the launcher
	lastSeen time.Time        // when the loop last heard from it
	facts    *proto.HostFacts // from its joined event; nil until it joined
	lastErr  string           // its last error message
	// life is what the agent's reader saw, apart from the loop: a loop
	// busy with a slow view must not count the agents it has not yet
	// listened to as silent.
	life agentLife
}

// attempt is the state of one run of the job.
type attempt struct {
	p        *Job
	rt       Runtime
	n        int
	view     status.View
	agents   []*agentState    // by node
	tails    map[int][]string // rank → last lines
	failure  error            // the first reason the job is going down
	stopping bool
	// Every failure of the attempt, so that the report can name the one
	// that caused the others whatever order their events arrived in.
	failed    []*RankFailedError
	lost      []*AgentLostError
	exits     map[int]int      // rank → exit code, of every rank that exited
	deadline  <-chan time.Time // agents still running then are killed
	lastCheck time.Time        // when the loop last checked for silent agents

	secret   []byte // this attempt's rendezvous secret
	rdzvPort int
	rdzvBind string
	rdzvMsgs chan string // refusals logged by the rendezvous server
	roundErr chan error  // the membership round did not close

	// rdzvEndpoint is the etcd endpoint the agents meet at (Runtime.Etcd);
	// "" for the launcher's own server.
	rdzvEndpoint string

	joinDeadline <-chan time.Time // every agent must have joined by then

	hang *hangState // the watch for hangs and stragglers (hang.go)

	ctx     context.Context // the attempt's, for Runtime.Plan's goroutine
	planned chan planResult // Runtime.Plan's answer (attemptplan.go)
	missing []int           // nodes whose agents never joined
}

// runAttempt runs attempt n of job p; besides its outcome it returns the
// failures it puts on its nodes (blamed), for an elastic job's next choice.
func runAttempt(ctx context.Context, p *Job, rt Runtime, n int) (error, []blame) {
	a := &attempt{p: p, rt: rt, n: n, view: rt.View, tails: map[int][]string{}, exits: map[int]int{},
		joinDeadline: time.After(joinBackstop(rt)), rdzvMsgs: make(chan string, 16), roundErr: make(chan error, 1),
		ctx: ctx, planned: make(chan planResult, 1)}
	for range p.Hosts {
		a.agents = append(a.agents, &agentState{})
	}
	a.newHang()
	defer a.hang.stopT()
	if rt.LogDir != "" {
		closeLogs, err := a.openLogDir()
		if err != nil {
			notice(rt.View, err.Error())
			return err, nil
		}
		defer closeLogs()
	}
	var rdzv roundHost
	if rt.usesRendezvous() {
		var err error
		if rdzv, err = a.listenRendezvous(ctx); err != nil {
			notice(rt.View, err.Error())
			return err, nil
		}
		defer rdzv.Close()
	}
	msgs := make(chan agentMsg, 64)
	if err := a.startAgents(ctx, msgs); err != nil {
		notice(rt.View, err.Error())
		return err, nil
	}
	if rdzv != nil {
		go a.waitRound(ctx, rdzv)
	}
	a.loop(ctx, msgs)
	a.reportDumps()
	a.summarizeStragglers()
	for _, g := range a.agents {
		_ = g.conn.Close()
	}
	err := a.result()
	return err, a.blamed(err)
}

// openLogDir adds the attempt's log files to its views; the function it
// returns closes them.
func (a *attempt) openLogDir() (func(), error) {
	ld, err := status.NewLogDir(a.rt.LogDir, a.p.RunID, a.n)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			dir := filepath.Join(a.rt.LogDir, a.p.RunID, "attempt-"+strconv.Itoa(a.n))
			err = usage.Errorf("launch: --log-dir: %s exists already (logs of run id %q): choose another --log-dir or --rdzv-id", dir, a.p.RunID)
		}
		return nil, err
	}
	a.view = status.Multi(a.rt.View, ld)
	return func() {
		if err := ld.Close(); err != nil {
			notice(a.rt.View, "log dir: "+err.Error())
		}
	}, nil
}

// startAgents starts every node's agent at once, and a reader for each. If
// any host cannot be reached, the agents already up are stopped (they start
// no rank before the start command) and every failing host is reported.
func (a *attempt) startAgents(ctx context.Context, msgs chan<- agentMsg) error {
	errs := make([]error, len(a.p.Hosts))
	var wg sync.WaitGroup
	for i, h := range a.p.Hosts {
		wg.Go(func() {
			asg := a.p.Assignment(i, a.n)
			asg.Env = a.withDumpEnv(asg.Env)
			if a.rt.usesRendezvous() {
				asg.Rendezvous = a.rendezvousFor(h)
			}
			a.agents[i].conn, errs[i] = a.rt.Transport.Start(ctx, h, asg)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, g := range a.agents {
			if g.conn != nil {
				_ = g.conn.Close()
			}
		}
		return err
	}
	for i, g := range a.agents {
		go g.life.read(g.conn, i, msgs)
	}
	return nil
}

// joined records an agent's host facts; once every node has joined, the
// ranks are started everywhere at once.
func (a *attempt) joined(ev proto.Event) {
	if ev.Node < 0 || ev.Node >= len(a.agents) || a.agents[ev.Node].facts != nil {
		return
	}
	g := a.agents[ev.Node]
	g.facts = ev.Facts
	if ev.Facts == nil {
		g.facts = &proto.HostFacts{}
	}
	if err := g.facts.Check(); err != nil {
		notice(a.view, err.Error())
		g.facts.Host = nil
	}
	a.p.SetHostFacts(ev.Node, g.facts.Host)
	for _, g := range a.agents {
		if g.facts == nil {
			return
		}
	}
	a.joinDeadline = nil
	if !a.stopping {
		a.startRanks()
	}
}

// missingJoin fails the job naming the hosts whose agents never joined.
func (a *attempt) missingJoin() {
	var missing []string
	for i, g := range a.agents {
		if g.facts == nil {
			missing = append(missing, a.p.Hosts[i].Name)
			a.missing = append(a.missing, i)
		}
	}
	a.agentLost(&AgentLostError{Host: strings.Join(missing, ", "), Node: -1,
		Err: fmt.Errorf("agent did not join within %v", a.rt.JoinTimeout)}, "join timeout")
}

// loop handles events until every agent's stream has ended.
func (a *attempt) loop(ctx context.Context, msgs <-chan agentMsg) {
	live := len(a.agents)
	interrupted := ctx.Done()
	abort := a.rt.Abort
	var check <-chan time.Time
	if a.p.Heartbeat > 0 {
		t := time.NewTicker(a.p.Heartbeat)
		defer t.Stop()
		check = t.C
	}
	for _, g := range a.agents {
		g.lastSeen = time.Now()
	}
	a.lastCheck = time.Now()
	for live > 0 {
		select {
		case m := <-msgs:
			a.agents[m.node].lastSeen = time.Now()
			if m.end {
				live--
				a.agents[m.node].ended = true
				a.agentEnded(m)
				continue
			}
			a.handle(m.ev)
		case <-check:
			a.sendAll(proto.CommandHeartbeat, "")
			a.checkSilent(time.Now()) // not the tick's time, which a busy loop sees late
		case <-a.joinDeadline:
			a.joinDeadline = nil
			a.missingJoin()
		case err := <-a.roundErr:
			a.joinDeadline = nil
			a.fail(fmt.Errorf("launch: %w", err), "round incomplete")
		case line := <-a.rdzvMsgs:
			notice(a.view, "rendezvous: "+line)
		case <-interrupted:
			interrupted = nil
			a.fail(jobStopped(context.Cause(ctx)), "interrupted")
		case <-abort:
			abort = nil
			a.fail(jobStopped(context.Cause(ctx)), "killed")
			a.sendAll(proto.CommandKill, "second interrupt")
		case <-a.deadline:
			a.deadline = nil
			a.killAll()
		case now := <-a.hang.tick:
			a.checkHang(ctx, now)
		case e := <-a.hang.reports:
			a.hangReported(e)
		case r := <-a.planned:
			a.plannedStart(r)
		}
	}
}

// killAll kills every agent still running at the teardown deadline.
func (a *attempt) killAll() {
	notice(a.view, "agents did not finish teardown in time; killing them")
	for _, g := range a.agents {
		g.gone = true // ended by us, not lost
		_ = g.conn.Kill()
	}
}

// handle passes an agent event to the views and reacts to failures.
func (a *attempt) handle(ev proto.Event) {
	a.observeHang(ev)
	switch ev.Type {
	case proto.EventError:
		// Agent problems are for the user: show them as notices. The last
		// one explains the agent's end if it ends without finishing.
		if ev.Node >= 0 && ev.Node < len(a.agents) {
			a.agents[ev.Node].lastErr = ev.Message
		}
		notice(a.view, fmt.Sprintf("%s: %s", ev.Host, ev.Message))
		return
	case proto.EventLog:
		t := append(a.tails[ev.Rank], ev.Line)
		if len(t) > a.rt.LastLines {
			t = t[len(t)-a.rt.LastLines:]
		}
		a.tails[ev.Rank] = t
	case proto.EventJoined:
		a.joined(ev)
	case proto.EventDone:
		a.agents[ev.Node].done = true
	case proto.EventRankExited:
		if a.exits == nil {
			a.exits = map[int]int{}
		}
		a.exits[ev.Rank] = ev.Code
		if a.preemptedRank(ev) {
			break
		}
		if ev.Code != 0 && !ev.Killed {
			a.view.Event(ev)
			a.rankFailed(ev)
			return
		}
	}
	a.view.Event(ev)
}

// rankFailed records a rank that ended badly on its own and stops the job.
// The report waits for the end of the teardown (see result): the first rank
// to be reported is not always the cause.
func (a *attempt) rankFailed(ev proto.Event) {
	rf := &RankFailedError{Host: ev.Host, Node: ev.Node, Rank: ev.Rank, LocalRank: ev.Local,
		PID: ev.PID, Code: ev.Code, Signal: ev.Signal, Message: ev.Message, LastLines: a.tails[ev.Rank],
		Time: ev.Time, PeerFailed: ev.PeerFailed}
	a.failed = append(a.failed, rf)
	if a.failure == nil && len(a.exits) < len(a.p.Ranks) {
		notice(a.view, "stopping the job: "+rf.short())
	}
	a.fail(rf, fmt.Sprintf("rank %d failed", ev.Rank))
}

// agentLost records a lost agent (once per agent) and stops the job.
func (a *attempt) agentLost(e *AgentLostError, why string) {
	if e.Node >= 0 {
		if a.agents[e.Node].gone {
			return
		}
		a.agents[e.Node].gone = true
	}
	e.at = time.Now()
	a.lost = append(a.lost, e)
	a.announceLost(e)
	if a.failure == nil && a.othersRunning(e.Node) {
		notice(a.view, "stopping the job: "+e.short())
	}
	a.fail(e, why)
}

// othersRunning says whether an agent other than node's is still going,
// so that stopping the job takes a while worth announcing.
func (a *attempt) othersRunning(node int) bool {
	for i, g := range a.agents {
		if i != node && !g.ended && !g.done {
			return true
		}
	}
	return false
}

// agentEnded handles the end of an agent's event stream. An agent that ends
// before saying done was lost.
func (a *attempt) agentEnded(m agentMsg) {
	g := a.agents[m.node]
	if g.done {
		return
	}
	err := m.err
	if err == io.EOF {
		err = errors.New("agent exited before its ranks finished")
		if g.lastErr != "" {
			err = errors.New(g.lastErr)
		}
	}
	h := a.p.Hosts[m.node]
	a.agentLost(&AgentLostError{Host: h.Name, Node: m.node, Err: err, Stderr: g.conn.Stderr()}, "agent lost")
}

// checkSilent declares lost, and kills, every agent not heard from (no event,
// not even a heartbeat) for SilentAfter the heartbeat interval: a hung agent
// or a dead network must not hang the job. An agent that has said nothing
// at all yet is left to the join deadline instead.
func (a *attempt) checkSilent(now time.Time) {
	limit := SilentAfter(a.p.Heartbeat)
	last := a.lastCheck
	a.lastCheck = now
	if now.Sub(last) > 2*a.p.Heartbeat+time.Second {
		// The loop (or this whole process) was held up since the last
		// check: the readers may not have run yet. Judge next time.
		return
	}
	for i, g := range a.agents {
		if g.ended || g.done || g.life.alive(now, limit) || now.Sub(g.lastSeen) < limit {
			continue
		}
		if g.life.heard.Load() == 0 && a.joinDeadline != nil {
			// Never heard from: its process may still be starting on a
			// loaded host. The join timeout bounds that (missingJoin).
			continue
		}
		h := a.p.Hosts[i]
		a.agentLost(&AgentLostError{Host: h.Name, Node: i, Err: fmt.Errorf("no heartbeat for %v", now.Sub(g.lastSeen).Round(time.Second))}, "agent lost")
		_ = g.conn.Kill()
		g.lastSeen = now // killed: its stream ends shortly; reported once
	}
}

// fail records the first failure and tears every node down. Rank failures
// and lost agents are reported at the end of the attempt (result); other
// failures at once.
func (a *attempt) fail(err error, why string) {
	if a.failure == nil {
		a.failure = err
		a.announce(err)
	}
	if a.stopping {
		return
	}
	a.stopping = true
	a.sendStop(why, stopSignal(err))
	a.deadline = time.After(a.p.Grace + a.rt.AgentGrace)
}

// announce tells the user why the job is stopping, for failures other than
// those of ranks and agents.
func (a *attempt) announce(err error) {
	var ie *InterruptedError
	switch {
	case err == nil, errors.Is(err, errDetected):
	case errors.As(err, new(*RankFailedError)), errors.As(err, new(*AgentLostError)):
	case errors.As(err, &ie) && ie.Preemption():
		notice(a.view, fmt.Sprintf("%s: stopping every rank (each gets %s; the built-in engine saves a checkpoint first); a second signal kills them at once",
			signalName(ie.Signal), signalName(ie.Signal)))
	default:
		notice(a.view, err.Error())
	}
}

// stopSignal is the signal the agents send the ranks at a stop: the
// preemption signal gtrain received (SIGTERM or SIGUSR1), forwarded as is,
// else "" for the agents' default, SIGTERM.
func stopSignal(err error) string {
	var ie *InterruptedError
	if errors.As(err, &ie) && ie.Preemption() {
		return signalName(ie.Signal)
	}
	return ""
}

// sendStop asks every agent that has not finished to stop its ranks.
func (a *attempt) sendStop(why, sig string) {
	a.send(proto.Command{V: proto.Version, Type: proto.CommandStop, Reason: why, Signal: sig})
}

// sendAll sends a command to every agent that has not finished.
func (a *attempt) sendAll(typ, reason string, env ...string) {
	a.send(proto.Command{V: proto.Version, Type: typ, Reason: reason, Env: env})
}

// send sends c to every agent that has not finished.
func (a *attempt) send(c proto.Command) {
	for _, g := range a.agents {
		if !g.done {
			_ = g.conn.Send(c)
		}
	}
}

// result is the attempt's outcome once every agent has ended. Among rank
// failures and lost agents it reports the root cause, naming the others; a
// preemption that every rank answered by saving is a *ResumableError.
func (a *attempt) result() error {
	var ie *InterruptedError
	switch {
	case errors.As(a.failure, new(*RankFailedError)), errors.As(a.failure, new(*AgentLostError)):
		err, report := rootCause(a.failed, a.lost)
		notice(a.view, report)
		return err
	case errors.As(a.failure, &ie) && ie.Preemption():
		if a.resumable() {
			err := &ResumableError{Signal: ie.Signal}
			notice(a.view, err.Error())
			return err
		}
		notice(a.view, a.failure.Error())
	}
	return a.failure
}

// resumable says whether every rank of the job exited 0 or ExitResumable,
// at least one of them ExitResumable: the ranks answered a preemption
// signal by saving their state.
func (a *attempt) resumable() bool {
	saved := false
	for _, code := range a.exits {
		switch code {
		case ExitResumable:
			saved = true
		case 0:
		default:
			return false
		}
	}
	return saved && len(a.exits) == len(a.p.Ranks)
}

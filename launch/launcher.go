package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
	"github.com/gtrain/gtrain/rendezvous"
)

// Runtime is what Run needs besides the Job.
type Runtime struct {
	Transport Transport
	View      status.View     // receives every event of every attempt
	LogDir    string          // "" = no log files; else one file per rank per attempt
	Abort     <-chan struct{} // closed on a second interrupt: SIGKILL everything now
	LastLines int             // lines of a failed rank's output to report (default 10)
	// AgentGrace is how long after a stop the launcher waits, beyond the
	// ranks' grace period, before killing an agent that has not finished.
	AgentGrace time.Duration
	// JoinTimeout bounds the wait for every agent's joined event (default 60s).
	JoinTimeout time.Duration
	// RendezvousBind is where the rendezvous server listens (default
	// 127.0.0.1:0 for a job on this machine alone, else :0).
	RendezvousBind string
	// RendezvousHost is the address remote agents dial for the rendezvous
	// (default: the launcher's address as each host's SSH session sees it).
	RendezvousHost string
	// NoRendezvous starts no rendezvous server and asks no agent to join
	// one: for agents that cannot reach the network, like in-memory test
	// agents. Ranks of the built-in engine need the rendezvous.
	NoRendezvous bool
	// RestartWait is the wait before the first restart (default 1s); it
	// doubles for each restart after it, up to RestartWaitMax (default 30s).
	RestartWait, RestartWaitMax time.Duration
}

// Run executes the job: it starts one agent per host, streams their events
// to rt.View, and tears the whole job down when a rank fails, an agent is
// lost, or ctx is cancelled (context.Cause(ctx) should then be an
// *InterruptedError). After a rank failure or a lost agent the job is
// restarted, all ranks together, up to p.MaxRestarts times, waiting longer
// before each restart (see Runtime.RestartWait). It returns nil when every
// rank of an attempt exited with code 0; every error it returns has been
// announced to rt.View as a notice first.
func Run(ctx context.Context, p *Job, rt Runtime) error {
	rt.setDefaults()
	for attempt := 0; ; attempt++ {
		err := runAttempt(ctx, p, rt, attempt)
		if !restartable(err) || attempt >= p.MaxRestarts || ctx.Err() != nil {
			return err
		}
		wait := rt.restartWait(attempt)
		notice(rt.View, fmt.Sprintf("%v; restarting the job in %v (restart %d of %d)", err, wait, attempt+1, p.MaxRestarts))
		if err := sleepCtx(ctx, wait); err != nil {
			err = jobStopped(err)
			notice(rt.View, err.Error())
			return err
		}
	}
}

func (rt *Runtime) setDefaults() {
	if rt.LastLines <= 0 {
		rt.LastLines = 10
	}
	if rt.AgentGrace <= 0 {
		rt.AgentGrace = 10 * time.Second
	}
	if rt.JoinTimeout <= 0 {
		rt.JoinTimeout = 60 * time.Second
	}
	if rt.RestartWait <= 0 {
		rt.RestartWait = time.Second
	}
	if rt.RestartWaitMax <= 0 {
		rt.RestartWaitMax = 30 * time.Second
	}
}

// restartable says whether a failed attempt is worth another: a rank failed
// or a host was lost. Interrupts, usage errors and start failures are not.
func restartable(err error) bool {
	var (
		rf   *RankFailedError
		lost *AgentLostError
	)
	return errors.As(err, &rf) || errors.As(err, &lost)
}

// restartWait is the wait before restart n+1: RestartWait doubled for each
// restart before it, capped at RestartWaitMax, so that a job that fails at
// once does not restart hundreds of times a second.
func (rt *Runtime) restartWait(n int) time.Duration {
	d := rt.RestartWait
	for range n {
		if d >= rt.RestartWaitMax/2 {
			return rt.RestartWaitMax
		}
		d *= 2
	}
	return min(d, rt.RestartWaitMax)
}

// sleepCtx waits for d, or returns ctx's cause at once when it ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// notice sends a message from gtrain to the views.
func notice(v status.View, msg string) {
	v.Event(proto.Event{V: proto.Version, Type: proto.EventNotice, Time: time.Now(), Rank: -1, Message: msg})
}

// agentMsg is one event, or the end of the stream, from the agent of node.
type agentMsg struct {
	node int
	ev   proto.Event
	err  error // set with end: why the stream ended (io.EOF when cleanly)
	end  bool
}

// attempt is the state of one run of the job.
type attempt struct {
	p        *Job
	rt       Runtime
	n        int
	view     status.View
	conns    []AgentConn
	done     []bool           // agent said done
	tails    map[int][]string // rank → last lines
	failure  error            // the first reason the job is going down
	stopping bool
	// Every failure of the attempt, so that the report can name the one
	// that caused the others whatever order their events arrived in.
	failed   []*RankFailedError
	lost     []*AgentLostError
	exits    map[int]int      // rank → exit code, of every rank that exited
	gone     []bool           // each agent was reported lost, or killed by the launcher
	deadline <-chan time.Time // agents still running then are killed
	lastSeen []time.Time      // when each agent was last heard from
	// life is what each agent's reader saw, apart from the loop: a loop
	// busy with a slow view must not count the agents it has not yet
	// listened to as silent.
	life      []agentLife
	lastCheck time.Time // when the loop last checked for silent agents
	ended     []bool    // each agent's event stream has ended
	facts     []*proto.HostFacts
	lastErr   []string // each agent's last error message

	secret   []byte // this attempt's rendezvous secret
	rdzvPort int
	rdzvBind string
	rdzvMsgs chan string // refusals logged by the rendezvous server
	roundErr chan error  // the membership round did not close

	joinDeadline <-chan time.Time // every agent must have joined by then
}

// SilentAfter is how long either end of an agent connection may hear
// nothing before it counts the other as gone: five heartbeats, and never
// less than 3 s so that a busy machine does not fail a job.
func SilentAfter(beat time.Duration) time.Duration {
	return max(5*beat, 3*time.Second)
}

func runAttempt(ctx context.Context, p *Job, rt Runtime, n int) error {
	a := &attempt{p: p, rt: rt, n: n, view: rt.View, tails: map[int][]string{}, exits: map[int]int{}, gone: make([]bool, len(p.Hosts)),
		done: make([]bool, len(p.Hosts)), ended: make([]bool, len(p.Hosts)), lastSeen: make([]time.Time, len(p.Hosts)),
		facts: make([]*proto.HostFacts, len(p.Hosts)), lastErr: make([]string, len(p.Hosts)), life: make([]agentLife, len(p.Hosts)),
		joinDeadline: time.After(joinBackstop(rt)), rdzvMsgs: make(chan string, 16), roundErr: make(chan error, 1)}
	if rt.LogDir != "" {
		ld, err := status.NewLogDir(rt.LogDir, p.RunID, n)
		if err != nil {
			if errors.Is(err, fs.ErrExist) {
				dir := filepath.Join(rt.LogDir, p.RunID, "attempt-"+strconv.Itoa(n))
				err = usage.Errorf("launch: --log-dir: %s exists already (logs of run id %q): choose another --log-dir or --rdzv-id", dir, p.RunID)
			}
			notice(rt.View, err.Error())
			return err
		}
		a.view = status.Multi(rt.View, ld)
		defer func() {
			if err := ld.Close(); err != nil {
				notice(rt.View, "log dir: "+err.Error())
			}
		}()
	}
	var rdzv *rendezvous.Server
	if !rt.NoRendezvous {
		var err error
		if rdzv, err = a.listenRendezvous(ctx); err != nil {
			notice(rt.View, err.Error())
			return err
		}
		defer rdzv.Close()
	}
	msgs := make(chan agentMsg, 64)
	if err := a.startAgents(ctx, msgs); err != nil {
		notice(rt.View, err.Error())
		return err
	}
	if rdzv != nil {
		go a.waitRound(ctx, rdzv)
	}
	a.loop(ctx, msgs)
	for _, c := range a.conns {
		_ = c.Close()
	}
	return a.result()
}

// startAgents starts every node's agent at once, and a reader for each. If
// any host cannot be reached, the agents already up are stopped (they start
// no rank before the start command) and every failing host is reported.
func (a *attempt) startAgents(ctx context.Context, msgs chan<- agentMsg) error {
	a.conns = make([]AgentConn, len(a.p.Hosts))
	errs := make([]error, len(a.p.Hosts))
	var wg sync.WaitGroup
	for i, h := range a.p.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := a.p.Spec(i, a.n)
			if !a.rt.NoRendezvous {
				spec.Rendezvous = a.rendezvousFor(h)
			}
			a.conns[i], errs[i] = a.rt.Transport.Start(ctx, h, spec)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range a.conns {
			if c != nil {
				_ = c.Close()
			}
		}
		return err
	}
	for i, c := range a.conns {
		go a.life[i].read(c, i, msgs)
	}
	return nil
}

// joined records an agent's host facts; once every node has joined, the
// ranks are started everywhere at once.
func (a *attempt) joined(ev proto.Event) {
	if ev.Node < 0 || ev.Node >= len(a.facts) || a.facts[ev.Node] != nil {
		return
	}
	a.facts[ev.Node] = ev.Facts
	if ev.Facts == nil {
		a.facts[ev.Node] = &proto.HostFacts{}
	}
	for _, f := range a.facts {
		if f == nil {
			return
		}
	}
	a.joinDeadline = nil
	if !a.stopping {
		a.sendAll(proto.CommandStart, "", a.masterEnv()...)
	}
}

// missingJoin fails the job naming the hosts whose agents never joined.
func (a *attempt) missingJoin() {
	var missing []string
	for i, f := range a.facts {
		if f == nil {
			missing = append(missing, a.p.Hosts[i].Name)
		}
	}
	a.agentLost(&AgentLostError{Host: strings.Join(missing, ", "), Node: -1,
		Err: fmt.Errorf("agent did not join within %v", a.rt.JoinTimeout)}, "join timeout")
}

// masterEnv is MASTER_ADDR and MASTER_PORT where the job left them to be
// determined at launch: the address the other nodes reach node 0 at (as
// this launcher reached it, or, when node 0 is this machine, the address a
// remote host sees this machine at), and a port node 0 found free.
func (a *attempt) masterEnv() []string {
	var env []string
	if a.p.MasterAddr == "" {
		env = append(env, "MASTER_ADDR="+a.masterAddr())
	}
	if a.p.MasterPort == 0 {
		port := a.facts[0].FreePort
		if port == 0 {
			port, _ = FreePort()
		}
		env = append(env, "MASTER_PORT="+strconv.Itoa(port))
	}
	return env
}

// addrConn is an agent connection that knows its network addresses.
type addrConn interface {
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
}

func (a *attempt) masterAddr() string {
	if h0 := a.p.Hosts[0]; !h0.Local {
		if c, ok := a.conns[0].(addrConn); ok {
			return hostOnly(c.RemoteAddr())
		}
		return strings.Trim(h0.Name, "[]")
	}
	for i, h := range a.p.Hosts {
		if c, ok := a.conns[i].(addrConn); ok && !h.Local {
			return hostOnly(c.LocalAddr())
		}
	}
	return "127.0.0.1"
}

func hostOnly(addr net.Addr) string {
	h, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return h
}

// loop handles events until every agent's stream has ended.
func (a *attempt) loop(ctx context.Context, msgs <-chan agentMsg) {
	live := len(a.conns)
	interrupted := ctx.Done()
	abort := a.rt.Abort
	var check <-chan time.Time
	if a.p.Heartbeat > 0 {
		t := time.NewTicker(a.p.Heartbeat)
		defer t.Stop()
		check = t.C
	}
	for i := range a.lastSeen {
		a.lastSeen[i] = time.Now()
	}
	a.lastCheck = time.Now()
	for live > 0 {
		select {
		case m := <-msgs:
			a.lastSeen[m.node] = time.Now()
			if m.end {
				live--
				a.ended[m.node] = true
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
			notice(a.view, "agents did not finish teardown in time; killing them")
			for i, c := range a.conns {
				a.gone[i] = true // ended by us, not lost
				_ = c.Kill()
			}
		}
	}
}

// handle passes an agent event to the views and reacts to failures.
func (a *attempt) handle(ev proto.Event) {
	switch ev.Type {
	case proto.EventError:
		// Agent problems are for the user: show them as notices. The last
		// one explains the agent's end if it ends without finishing.
		if ev.Node >= 0 && ev.Node < len(a.lastErr) {
			a.lastErr[ev.Node] = ev.Message
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
		a.done[ev.Node] = true
	case proto.EventRankExited:
		if a.exits == nil {
			a.exits = map[int]int{}
		}
		a.exits[ev.Rank] = ev.Code
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
	if a.gone == nil {
		a.gone = make([]bool, len(a.p.Hosts))
	}
	if e.Node >= 0 {
		if a.gone[e.Node] {
			return
		}
		a.gone[e.Node] = true
	}
	e.at = time.Now()
	a.lost = append(a.lost, e)
	if a.failure == nil && a.othersRunning(e.Node) {
		notice(a.view, "stopping the job: "+e.short())
	}
	a.fail(e, why)
}

// othersRunning says whether an agent other than node's is still going,
// so that stopping the job takes a while worth announcing.
func (a *attempt) othersRunning(node int) bool {
	for i := range a.conns {
		if i != node && !a.ended[i] && !a.done[i] {
			return true
		}
	}
	return false
}

// agentEnded handles the end of an agent's event stream. An agent that ends
// before saying done was lost.
func (a *attempt) agentEnded(m agentMsg) {
	if a.done[m.node] {
		return
	}
	err := m.err
	if err == io.EOF {
		err = errors.New("agent exited before its ranks finished")
		if msg := a.lastErr[m.node]; msg != "" {
			err = errors.New(msg)
		}
	}
	h := a.p.Hosts[m.node]
	a.agentLost(&AgentLostError{Host: h.Name, Node: m.node, Err: err, Stderr: a.conns[m.node].Stderr()}, "agent lost")
}

// checkSilent declares lost, and kills, every agent not heard from (no event,
// not even a heartbeat) for silentAfter the heartbeat interval: a hung agent
// or a dead network must not hang the job.
func (a *attempt) checkSilent(now time.Time) {
	limit := SilentAfter(a.p.Heartbeat)
	last := a.lastCheck
	a.lastCheck = now
	if now.Sub(last) > 2*a.p.Heartbeat+time.Second {
		// The loop (or this whole process) was held up since the last
		// check: the readers may not have run yet. Judge next time.
		return
	}
	for i, seen := range a.lastSeen {
		if a.ended[i] || a.done[i] || a.life[i].alive(now, limit) || now.Sub(seen) < limit {
			continue
		}
		h := a.p.Hosts[i]
		a.agentLost(&AgentLostError{Host: h.Name, Node: i, Err: fmt.Errorf("no heartbeat for %v", now.Sub(seen).Round(time.Second))}, "agent lost")
		_ = a.conns[i].Kill()
		a.lastSeen[i] = now // killed: its stream ends shortly; reported once
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
	case err == nil:
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
	for i, c := range a.conns {
		if !a.done[i] {
			_ = c.Send(proto.Command{V: proto.Version, Type: proto.CommandStop, Reason: why, Signal: sig})
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

// sendAll sends a command to every agent that has not finished.
func (a *attempt) sendAll(typ, reason string, env ...string) {
	for i, c := range a.conns {
		if !a.done[i] {
			_ = c.Send(proto.Command{V: proto.Version, Type: typ, Reason: reason, Env: env})
		}
	}
}

// Spec is the job spec for the agent of node i in the given attempt.
func (p *Job) Spec(i, attempt int) *proto.Spec {
	h := p.Hosts[i]
	s := &proto.Spec{
		V: proto.Version, RunID: p.RunID, Attempt: attempt, Node: h.Node, Host: h.Name,
		Command: p.Command, Dir: p.Dir, Env: p.Forward, GraceMillis: p.Grace.Milliseconds(),
		BeatMillis: p.Heartbeat.Milliseconds(), StatusFD: true, ErrorFiles: true, WaitStart: true,
		LauncherBeats: p.Heartbeat > 0,
	}
	for _, r := range p.Ranks {
		if r.Node == h.Node {
			s.Ranks = append(s.Ranks, proto.RankSpec{Rank: r.Rank, LocalRank: r.LocalRank, Env: p.RankEnv(r, attempt)})
		}
	}
	return s
}

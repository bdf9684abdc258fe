package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/gtrain/gtrain/internal/userfile"
	"github.com/gtrain/gtrain/launch/proto"
)

// RunAgent is the node agent (`gtrain agent`): it reads a proto.Assignment from in,
// starts the node's ranks, writes proto events to out, and returns once every
// rank has ended. It tears all ranks down when the launcher says stop, when in
// reaches end of file (the launcher is gone), or when ctx is cancelled (the
// agent itself was signalled). version is reported in the joined event.
func RunAgent(ctx context.Context, in io.Reader, out io.Writer, version string) error {
	survivePipe.Do(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) })
	enc := proto.NewEncoder(out)
	dec := proto.NewDecoder(in)
	var asg proto.Assignment
	if err := dec.Decode(&asg); err != nil {
		err = fmt.Errorf("agent: read assignment: %w", err)
		_ = enc.Encode(proto.Event{V: proto.Version, Type: proto.EventError, Time: time.Now(), Rank: -1, Message: err.Error()})
		return err
	}
	if err := checkAssignment(&asg); err != nil {
		_ = enc.Encode(proto.Event{V: proto.Version, Type: proto.EventError, Time: time.Now(), Host: asg.Host, Node: asg.Node, Rank: -1, Message: err.Error()})
		return err
	}
	a := &agent{asg: &asg, events: newEventWriter(enc), heard: time.Now()}
	defer a.events.close() // every event written before the agent exits
	a.pulse()
	defer a.endPulse()
	return a.run(ctx, dec, version)
}

// pulse beats at once and then every heartbeat interval while the agent
// prepares to join: its temporary directory, the host's detection and the
// rendezvous dial send nothing else, and on a loaded host they can take
// longer than the launcher's silence limit. The loops that follow
// (waitJoin, awaitStart, supervise) beat themselves, and end the pulse.
func (a *agent) pulse() {
	tick, stopTick := a.heartbeat()
	if tick == nil {
		a.endPulse = func() {}
		return
	}
	stop := make(chan struct{})
	var once sync.Once
	a.endPulse = func() { once.Do(func() { close(stop) }) }
	a.beat()
	go func() {
		defer stopTick()
		for {
			select {
			case <-tick:
				a.beat()
			case <-stop:
				return
			}
		}
	}()
}

// beat sends a heartbeat.
func (a *agent) beat() { a.emit(proto.Event{Type: proto.EventHeartbeat, Rank: -1}) }

// survivePipe makes a write to a closed stdout (the launcher, or its SSH
// session, gone) return EPIPE instead of killing the process, so that the
// agent tears its ranks down and removes its directory; a handler rather
// than SIG_IGN, which the ranks would inherit.
var survivePipe sync.Once

func checkAssignment(s *proto.Assignment) error {
	switch {
	case len(s.Command) == 0:
		return errors.New("agent: assignment has no command")
	case len(s.Ranks) == 0:
		return errors.New("agent: assignment has no ranks for this node")
	case s.GraceMillis < 0:
		return errors.New("agent: negative grace period")
	}
	return nil
}

// agent holds the state of one node agent run.
type agent struct {
	asg    *proto.Assignment
	events *eventWriter
	tmpdir string
	// tmpLock holds the liveness lock on tmpdir (agenttmp_linux.go) while
	// open; nil without one.
	tmpLock *os.File

	binds    map[int]*Binding // by local rank; nil: ranks start unbound
	startEnv []string         // from the start command, for every rank
	storeEnv []string         // GTRAIN_STORE_*: how ranks reach the rendezvous store
	heard    time.Time        // when the launcher last sent anything
	stopped  bool             // a teardown has begun
	endPulse func()           // ends the heartbeats of the preparation (pulse)

	mu    sync.Mutex
	ranks []*rankProc
}

// emit writes an event for this node, filling in the common fields.
func (a *agent) emit(ev proto.Event) {
	ev.V = proto.Version
	if ev.Time.IsZero() { // rank_exited carries the exit's own time
		ev.Time = time.Now()
	}
	ev.Host = a.asg.Host
	ev.Node = a.asg.Node
	a.events.send(ev)
}

func (a *agent) run(ctx context.Context, dec *proto.Decoder, version string) error {
	// Before joining, so that a host that cannot run ranks fails the job
	// before any rank starts anywhere.
	if err := a.prepareTmp(); err != nil {
		// No done event: the launcher counts this agent lost, with err as
		// the reason, and stops the job at once.
		a.emit(proto.Event{Type: proto.EventError, Rank: -1, Message: err.Error()})
		return err
	}
	defer a.removeTmp()
	cmds := make(chan proto.Command, 4)
	go readCommands(dec, cmds)
	facts := hostFacts(ctx, version)
	// Before joining too: a binding the host cannot give (more ranks than
	// cores under --bind core) must fail the job before any rank starts.
	if err := a.planBinds(facts.Host); err != nil {
		a.emit(proto.Event{Type: proto.EventError, Rank: -1, Message: err.Error()})
		return err
	}
	if a.asg.Rendezvous != nil {
		if err := a.join(ctx, cmds, facts); err != nil {
			if errors.Is(err, errStopped) {
				a.emit(proto.Event{Type: proto.EventDone, Rank: -1, Message: "stopped before start"})
				return nil
			}
			// No done event: the launcher counts this agent lost, with err as
			// the reason, and stops the job at once.
			a.emit(proto.Event{Type: proto.EventError, Rank: -1, Message: err.Error()})
			return err
		}
	}
	a.emit(proto.Event{Type: proto.EventJoined, Rank: -1, Facts: facts})
	if err := becomeSubreaper(); err != nil {
		a.emit(proto.Event{Type: proto.EventError, Rank: -1, Message: "agent: cannot become child subreaper: " + err.Error()})
	}
	if a.asg.WaitStart && !a.awaitStart(ctx, cmds) {
		a.emit(proto.Event{Type: proto.EventDone, Rank: -1, Message: "stopped before start"})
		return nil
	}

	all := make(chan struct{})
	var wg sync.WaitGroup
	for _, rs := range a.asg.Ranks {
		rp := a.start(rs)
		wg.Add(1)
		go func() { defer wg.Done(); <-rp.done }()
	}
	go func() { wg.Wait(); close(all) }()

	a.supervise(ctx, cmds, all)
	a.cleanup()
	a.emit(proto.Event{Type: proto.EventDone, Rank: -1})
	return nil
}

// prepareTmp makes the agent's temporary directory, for the ranks' error
// files and the store secret, and writes the secret into it. Without them a
// rank of the built-in engine cannot reach the job's store, so a temporary
// directory that cannot be written fails the job, naming the host and path.
func (a *agent) prepareTmp() error {
	if !a.asg.ErrorFiles && a.asg.Rendezvous == nil {
		return nil
	}
	dir, err := os.MkdirTemp("", "gtrain-"+safeName(a.asg.RunID)+"-")
	if err != nil {
		return fmt.Errorf("agent: host %s: temporary directory %s is not writable: %w (set TMPDIR to a writable directory on that host)",
			a.asg.Host, os.TempDir(), userfile.UnwrapPath(err))
	}
	a.tmpdir = dir
	// Housekeeping, which never fails the job: without the lock this
	// directory is only never swept, like those of older agents.
	a.tmpLock, _ = lockTmp(dir)
	sweepTmp(filepath.Dir(dir), dir)
	if a.storeEnv, err = a.rankStoreEnv(); err != nil {
		a.removeTmp()
		return fmt.Errorf("agent: host %s: temporary directory %s: %w (set TMPDIR to a writable directory on that host)", a.asg.Host, dir, err)
	}
	return nil
}

// removeTmp removes the agent's temporary directory, if it made one, and
// only then lets go of its liveness lock: a sweeping agent that opened the
// lock file meanwhile cannot take the lock until the file is gone, and
// then leaves the directory alone.
func (a *agent) removeTmp() {
	if a.tmpdir != "" {
		os.RemoveAll(a.tmpdir)
		a.tmpdir = ""
	}
	if a.tmpLock != nil {
		a.tmpLock.Close()
		a.tmpLock = nil
	}
}

// awaitStart waits for the launcher's start command, keeping up heartbeats,
// and keeps the environment it carries for the ranks. It reports false when
// the launcher said stop (or went away) instead.
func (a *agent) awaitStart(ctx context.Context, cmds <-chan proto.Command) bool {
	beat, stopBeat := a.heartbeat()
	defer stopBeat()
	a.endPulse()
	for {
		select {
		case <-ctx.Done():
			return false
		case now := <-beat:
			a.beat()
			if a.launcherSilent(now) {
				return false
			}
		case c := <-cmds:
			a.heard = time.Now()
			switch c.Type {
			case proto.CommandStart:
				a.startEnv = c.Env
				return true
			case proto.CommandStop, proto.CommandKill:
				return false
			}
		}
	}
}

// heartbeat ticks every heartbeat interval, or never when the assignment has none.
func (a *agent) heartbeat() (<-chan time.Time, func()) {
	d := a.asg.Heartbeat()
	if d <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// supervise waits for every rank to end, tearing them down when told to.
func (a *agent) supervise(ctx context.Context, cmds <-chan proto.Command, all <-chan struct{}) {
	beat, stopBeat := a.heartbeat()
	defer stopBeat()
	a.endPulse()
	var kill <-chan time.Time
	sigs := ctx.Done()
	for {
		select {
		case <-all:
			return
		case now := <-beat:
			a.beat()
			reapZombies(a.rankPIDs())
			if kill == nil && !a.stopped && a.launcherSilent(now) {
				kill = a.stop(a.asg.Grace(), syscall.SIGTERM)
			}
		case <-sigs:
			sigs = nil
			kill = a.stop(a.asg.Grace(), forwardedSignal(ctx))
		case c := <-cmds:
			a.heard = time.Now()
			switch c.Type {
			case proto.CommandStop:
				kill = a.stop(a.asg.Grace(), stopSignalOf(c.Signal))
			case proto.CommandKill:
				kill = a.stop(0, syscall.SIGKILL)
			case proto.CommandDump:
				a.signalRanks(c.Ranks, syscall.SIGUSR2)
			}
		case <-kill:
			kill = nil
			a.signalAll(syscall.SIGKILL)
		}
	}
}

// launcherSilent reports whether the launcher, which promised heartbeats,
// has sent nothing for SilentAfter: the network to it is gone (a dropped
// host may never see its connection close), so the ranks must not run on.
func (a *agent) launcherSilent(now time.Time) bool {
	if !a.asg.LauncherBeats || now.Sub(a.heard) < SilentAfter(a.asg.Heartbeat()) {
		return false
	}
	a.emit(proto.Event{Type: proto.EventError, Rank: -1,
		Message: fmt.Sprintf("agent: no word from the launcher for %v: stopping the ranks", now.Sub(a.heard).Round(time.Second))})
	return true
}

// readCommands forwards launcher commands; at end of input (the launcher is
// gone) or on a garbled line it asks for a stop, then keeps quiet.
func readCommands(dec *proto.Decoder, out chan<- proto.Command) {
	for {
		var c proto.Command
		if err := dec.Decode(&c); err != nil {
			out <- proto.Command{V: proto.Version, Type: proto.CommandStop, Reason: "launcher connection closed"}
			return
		}
		out <- c
	}
}

// stop starts a teardown: sig (SIGTERM, or a forwarded preemption signal)
// to every running rank's process group now, and a timer for the SIGKILL
// that follows after grace (at once if grace is 0).
func (a *agent) stop(grace time.Duration, sig syscall.Signal) <-chan time.Time {
	a.stopped = true
	if grace <= 0 {
		a.signalAll(syscall.SIGKILL)
		return nil
	}
	a.signalAll(sig)
	return time.After(grace)
}

// stopSignalOf is the signal a stop command names: SIGUSR1 is forwarded (a
// scheduler's warning that the job will be preempted); anything else,
// including nothing, is SIGTERM.
func stopSignalOf(name string) syscall.Signal {
	if name == "SIGUSR1" {
		return syscall.SIGUSR1
	}
	return syscall.SIGTERM
}

// forwardedSignal is the signal the ranks get when the agent itself was
// signalled: a preemption signal (SIGUSR1) is passed on, else SIGTERM.
func forwardedSignal(ctx context.Context) syscall.Signal {
	var ie *InterruptedError
	if errors.As(context.Cause(ctx), &ie) && ie.Signal == syscall.SIGUSR1 {
		return syscall.SIGUSR1
	}
	return syscall.SIGTERM
}

// signalAll signals the process group of every rank still running.
func (a *agent) signalAll(sig syscall.Signal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, rp := range a.ranks {
		if rp.pid > 0 && !rp.exited.Load() {
			rp.sent(sig)
			_ = signalGroup(rp.pid, sig)
		}
	}
}

// cleanup kills what a finished job left behind: members of each rank's
// process group that outlived their leader, and orphans re-parented to the
// agent because they escaped the group.
func (a *agent) cleanup() {
	a.mu.Lock()
	for _, rp := range a.ranks {
		if rp.pid > 0 {
			_ = signalGroup(rp.pid, syscall.SIGKILL)
		}
	}
	a.mu.Unlock()
	if pids := sweepOrphans(a.rankPIDs()); len(pids) > 0 {
		a.emit(proto.Event{Type: proto.EventError, Rank: -1, Message: fmt.Sprintf("agent: killed %d process(es) that outlived their rank: %v", len(pids), pids)})
	}
}

// rankPIDs returns the PIDs of the rank processes, which exec.Cmd.Wait
// reaps; the orphan sweeps must leave them alone.
func (a *agent) rankPIDs() map[int]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := make(map[int]bool, len(a.ranks))
	for _, rp := range a.ranks {
		if rp.pid > 0 && !rp.exited.Load() {
			m[rp.pid] = true
		}
	}
	return m
}

// hostFacts is what the agent tells the launcher of its host when it
// joins, the detected hardware included.
func hostFacts(ctx context.Context, version string) *proto.HostFacts {
	name, _ := os.Hostname()
	port, _ := FreePort() // 0 if none: the launcher then picks one itself
	return &proto.HostFacts{
		Hostname: name,
		OS:       runtime.GOOS,
		Arch:     runtime.GOARCH,
		CPUs:     runtime.NumCPU(),
		PID:      os.Getpid(),
		Version:  version,
		FreePort: port,
		Host:     DetectHost(ctx),
	}
}

// safeName keeps s usable inside a file name.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

package launch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

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
	// Etcd, when set, is the etcd cluster the nodes and ranks meet in
	// (--rdzv-backend etcd): the launcher runs no rendezvous server, and
	// each attempt meets under its own prefix (Prefix is set per attempt).
	Etcd *rendezvous.EtcdConfig
	// RestartWait is the wait before the first restart (default 1s); it
	// doubles for each restart after it, up to RestartWaitMax (default 30s).
	RestartWait, RestartWaitMax time.Duration
	// RestartJitter adds up to this fraction of each wait, at random, so
	// that jobs that failed together do not restart in step (0: none).
	RestartJitter float64
	// Plan, when set, is asked once every agent of an attempt has joined
	// and before any rank starts: it returns variables for every rank of
	// the attempt (the built-in engine's spec laid out for this world) and
	// notes for the user, or an error that ends the job.
	Plan func(ctx context.Context, w World) (Planned, error)
	// HangTimeout: a rank that reported a step and then none for this long,
	// while its process lives, makes every rank dump its flight record
	// (into LogDir), and the job stop with a *HangError naming whom the
	// ranks wait for (hang.go). 0: off.
	HangTimeout time.Duration
	// StragglerFactor marks a rank whose own work per step stays above this
	// many times the job's median (straggler.go). ≤ 1: off.
	StragglerFactor float64

	// meet, when set, replaces the attempt's own rendezvous: a per-node
	// job's attempts meet where all its nodes do (pernode_store.go).
	meet func(ctx context.Context, a *attempt) (roundHost, error)
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
	var m *membership
	if p.Elastic != nil {
		m = newMembership(p)
	}
	for attempt := 0; ; attempt++ {
		announceAttempt(rt.View, attempt, p)
		err, blamed := runAttempt(ctx, p, rt, attempt)
		if !restartable(err) || attempt >= p.MaxRestarts || ctx.Err() != nil {
			return err
		}
		if m != nil {
			m.record(rt.View, attempt, blamed)
		}
		wait := rt.restartWait(attempt)
		notice(rt.View, fmt.Sprintf("%v; restarting the job in %v (restart %d of %d)", err, wait.Round(10*time.Millisecond), attempt+1, p.MaxRestarts))
		if err := sleepCtx(ctx, wait); err != nil {
			err = jobStopped(err)
			notice(rt.View, err.Error())
			return err
		}
		if p, err = nextJob(ctx, p, rt, m, attempt+1); err != nil {
			notice(rt.View, err.Error())
			return err
		}
	}
}

// nextJob is the job of attempt n: for an elastic job on the hosts m
// chooses (probed now, after the wait), else on the same hosts; remade when
// the hosts change or gtrain picks MASTER_PORT, so that every attempt gets
// a fresh port as torchrun's elastic agent gives one.
func nextJob(ctx context.Context, p *Job, rt Runtime, m *membership, n int) (*Job, error) {
	if m == nil {
		if p.opts.Nodes == nil || p.opts.MasterPort != 0 || !p.allLocal() {
			return p, nil // a remote job's port is picked by node 0 at every start
		}
		return p.remade()
	}
	idx, err := m.next(ctx, rt.Transport, rt.View, n)
	if err != nil {
		return nil, err
	}
	if m.sameHosts(idx) && (p.opts.MasterPort != 0 || !p.allLocal()) {
		return p, nil
	}
	q, err := p.withNodes(idx)
	if err != nil {
		return nil, err
	}
	m.cur = idx
	return q, nil
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
// or a host was lost, or hung. Interrupts, usage errors and start failures are not.
func restartable(err error) bool {
	var (
		rf   *RankFailedError
		lost *AgentLostError
		hang *HangError
	)
	return errors.As(err, &rf) || errors.As(err, &lost) || errors.As(err, &hang)
}

// restartWait is the wait before restart n+1: RestartWait doubled for each
// restart before it, capped at RestartWaitMax, so that a job that fails at
// once does not restart hundreds of times a second.
func (rt *Runtime) restartWait(n int) time.Duration {
	d := rt.RestartWait
	for range n {
		if d >= rt.RestartWaitMax/2 {
			d = rt.RestartWaitMax
			break
		}
		d *= 2
	}
	d = min(d, rt.RestartWaitMax)
	if rt.RestartJitter > 0 {
		d += time.Duration(rand.Float64() * rt.RestartJitter * float64(d))
	}
	return d
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

// SilentAfter is how long either end of an agent connection may hear
// nothing before it counts the other as gone: five heartbeats, and never
// less than 3 s so that a busy machine does not fail a job.
func SilentAfter(beat time.Duration) time.Duration {
	return max(5*beat, 3*time.Second)
}

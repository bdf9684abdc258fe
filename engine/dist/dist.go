// Package dist sets up the distributed state of a built-in engine rank: it
// reads the rank's place in the job from the environment `gtrain run` gives
// every rank, reaches the job's rendezvous store with the job's secret, and
// bootstraps the world communicator through it (shared memory to the ranks
// on this host, authenticated TCP to the others).
package dist

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/userfile"
	"github.com/gtrain/gtrain/rendezvous"
)

// maxSecretFile bounds what is read of the store secret file: the agent
// writes a secret of rendezvous.SecretLen (32) bytes, and 64 KiB is far
// above any secret while a file named by mistake (/dev/zero, a log) is
// refused at once. Only a regular file is read, so that a FIFO cannot
// block a rank that has no context to stop it with.
const maxSecretFile = 64 << 10

// Env is a rank's place in the job.
type Env struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	Host                      string // the hostfile name of this rank's host
	RunID                     string
	Attempt                   int
	StoreAddr                 string
	Secret                    []byte
	CommAddr                  string // rankenv.CommAddr; empty for the default
	NoSHM                     bool
	// SpinWait is rankenv.CommSpinUS as comm.TCPConfig.SpinWait: 0 when
	// unset (the default), negative for "0" (no spinning).
	SpinWait time.Duration
	// Congestion is rankenv.CommTCPCC as comm.TCPConfig.Congestion: empty
	// when unset (the default).
	Congestion string
	// TCPBuf is rankenv.CommTCPBuf as comm.TCPConfig.BufSize: 0 when unset
	// or "0" (the kernel's autotuning).
	TCPBuf int
}

// FromEnv reads Env from the process environment (getenv is os.Getenv in
// production): the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE), the store's address and secret file the agent sets,
// and the user's rankenv.CommAddr, rankenv.NoSHM, rankenv.CommSpinUS,
// rankenv.CommTCPCC and rankenv.CommTCPBuf.
// An error names the variable and says how to get it.
func FromEnv(getenv func(string) string) (Env, error) {
	var e Env
	var errs []error
	num := func(name string, dst *int, lo int) {
		v := getenv(name)
		n, err := strconv.Atoi(v)
		switch {
		case v == "":
			errs = append(errs, fmt.Errorf("%s is not set", name))
		case err != nil || n < lo:
			errs = append(errs, fmt.Errorf("%s=%q is not a number >= %d", name, v, lo))
		default:
			*dst = n
		}
	}
	num(rankenv.Rank, &e.Rank, 0)
	num(rankenv.WorldSize, &e.WorldSize, 1)
	num(rankenv.LocalRank, &e.LocalRank, 0)
	num(rankenv.LocalWorldSize, &e.LocalWorldSize, 1)
	e.Host, e.RunID = getenv(rankenv.Host), getenv(rankenv.GtrainRunID)
	if v := getenv(rankenv.Attempt); v != "" {
		e.Attempt, _ = strconv.Atoi(v)
	}
	e.StoreAddr = getenv(rankenv.StoreAddr)
	file := getenv(rankenv.StoreSecretFile)
	switch {
	case e.StoreAddr == "":
		errs = append(errs, fmt.Errorf("%s is not set", rankenv.StoreAddr))
	case file == "":
		errs = append(errs, fmt.Errorf("%s is not set", rankenv.StoreSecretFile))
	default:
		s, err := userfile.ReadRegular(file, maxSecretFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rankenv.StoreSecretFile, err))
		}
		e.Secret = s
	}
	if len(errs) == 0 && e.Rank >= e.WorldSize {
		errs = append(errs, fmt.Errorf("%s %d is not below %s %d", rankenv.Rank, e.Rank, rankenv.WorldSize, e.WorldSize))
	}
	e.CommAddr = getenv(rankenv.CommAddr)
	e.NoSHM = getenv(rankenv.NoSHM) == "1"
	if err := errors.Join(errs...); err != nil {
		return Env{}, fmt.Errorf("dist: not a rank of a gtrain job (run it with gtrain run): %s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	spin, err := spinWait(getenv(rankenv.CommSpinUS))
	if err != nil {
		return Env{}, fmt.Errorf("dist: %w", err)
	}
	e.SpinWait = spin
	e.Congestion = getenv(rankenv.CommTCPCC)
	if err := comm.CheckTCPCongestion(e.Congestion); err != nil {
		return Env{}, fmt.Errorf("dist: %s: %w", rankenv.CommTCPCC, err)
	}
	if e.TCPBuf, err = tcpBuf(getenv(rankenv.CommTCPBuf)); err != nil {
		return Env{}, fmt.Errorf("dist: %w", err)
	}
	return e, nil
}

// tcpBuf reads rankenv.CommTCPBuf, whole bytes: 0 (autotuning) or from
// comm.MinTCPBufSize to comm.MaxTCPBufSize.
func tcpBuf(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n != 0 && (n < comm.MinTCPBufSize || n > comm.MaxTCPBufSize) {
		return 0, fmt.Errorf("%s=%.40q: want whole bytes from %d to %d for SO_SNDBUF and SO_RCVBUF, or 0 (or unset) for the kernel's autotuning",
			rankenv.CommTCPBuf, v, comm.MinTCPBufSize, comm.MaxTCPBufSize)
	}
	return n, nil
}

// spinWait reads rankenv.CommSpinUS, whole microseconds, bounded by
// comm.MaxTCPSpinWait: a longer spin would only burn a core a stalled peer
// does not need.
func spinWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if most := comm.MaxTCPSpinWait.Microseconds(); err != nil || n < 0 || int64(n) > most {
		return 0, fmt.Errorf("%s=%.40q: want whole microseconds from 0 (sleep in poll(2) at once) to %d, or unset it for the default %d",
			rankenv.CommSpinUS, v, most, comm.DefaultTCPSpinWait.Microseconds())
	}
	if n == 0 {
		return -1, nil
	}
	return time.Duration(n) * time.Microsecond, nil
}

// World is a rank's connection to the rest of the job: the world
// communicator and what it runs on.
type World struct {
	Env   Env
	Comm  *comm.Communicator
	Store rendezvous.Backend
	tr    comm.Transport
}

// Options tune Init. The zero value is usable.
type Options struct {
	Comm comm.Options
	TCP  comm.TCPConfig // tuning only: identity fields are filled in
	SHM  comm.SHMConfig // tuning only: identity fields are filled in
}

// Init connects this rank to the store and to every other rank, and
// returns the world communicator (named "world"). TCP links are
// advertised on the address this host reached the store from, unless
// Env.CommAddr or Options.TCP.Advertise says otherwise. Every rank of the
// job must call Init; it fails after Options.Comm.Timeout (default 60 s)
// naming the ranks that did not come.
func Init(ctx context.Context, env Env, opts Options) (*World, error) {
	st, err := dialStore(ctx, env, opts.Comm.Timeout)
	if err != nil {
		return nil, fmt.Errorf("dist: rank %d: reach the job's store: %w", env.Rank, err)
	}
	tcp := opts.TCP
	if tcp.SpinWait == 0 {
		tcp.SpinWait = env.SpinWait
	}
	if tcp.Congestion == "" {
		tcp.Congestion = env.Congestion
	}
	if tcp.BufSize == 0 {
		tcp.BufSize = env.TCPBuf
	}
	if tcp.Advertise == "" {
		tcp.Advertise = env.CommAddr
	}
	if ta, ok := st.LocalAddr().(*net.TCPAddr); ok && tcp.Advertise == "" && !ta.IP.IsLoopback() {
		tcp.Advertise = ta.IP.String()
	}
	prefix := fmt.Sprintf("comm/%s/%d", env.RunID, env.Attempt)
	tr, err := comm.Connect(ctx, comm.BootstrapConfig{
		Rank: env.Rank, Size: env.WorldSize, Store: st, Secret: env.Secret, Prefix: prefix,
		NoSHM: env.NoSHM, TCP: tcp, SHM: opts.SHM,
	})
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("dist: rank %d: %w", env.Rank, err)
	}
	co := opts.Comm
	if co.Name == "" {
		co.Name = "world"
	}
	if co.Hosts == nil {
		co.Hosts = comm.HostNames(tr)
	}
	c, err := comm.New(ctx, env.Rank, env.WorldSize, tr, co)
	if err != nil {
		tr.Close()
		st.Close()
		return nil, fmt.Errorf("dist: %w", err)
	}
	return &World{Env: env, Comm: c, Store: st, tr: tr}, nil
}

// Hosts returns the host name of every rank.
func (w *World) Hosts() []string { return comm.HostNames(w.tr) }

// dialStore connects to the store: the launcher's server, or the job's
// etcd (rendezvous.Open reads which from the address). Every rank of a
// large job dials at once, and the server authenticates only so many
// connections at a time:
// a busy refusal is retried after a random pause that grows, until
// timeout (default 60 s).
func dialStore(ctx context.Context, env Env, timeout time.Duration) (rendezvous.Backend, error) {
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	deadline := time.Now().Add(timeout)
	pause := 10 * time.Millisecond
	for {
		st, err := rendezvous.Open(ctx, env.StoreAddr, env.Secret)
		if err == nil || !errors.Is(err, rendezvous.ErrBusy) || time.Now().After(deadline) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause/2 + rand.N(pause)):
		}
		pause = min(2*pause, time.Second)
	}
}

// Close closes the communicator, its links and the store connection.
func (w *World) Close() error {
	return errors.Join(w.Comm.Close(), w.tr.Close(), w.Store.Close())
}

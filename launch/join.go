package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/rendezvous"
)

// rendezvousDialTimeout bounds an agent's connection to the rendezvous.
const rendezvousDialTimeout = 10 * time.Second

// errStopped means the launcher stopped the job while the agent waited.
var errStopped = errors.New("stopped")

// rendezvousAddr is the server's address as this host reaches it, or the
// etcd endpoint where the job meets instead.
func rendezvousAddr(r *proto.Rendezvous, sshConnection string) string {
	if r.Endpoint != "" {
		return r.Endpoint
	}
	host := r.Host
	if host == "" {
		// SSH_CONNECTION is "client_ip client_port server_ip server_port":
		// the client is the launcher, as this host sees it.
		if f := strings.Fields(sshConnection); len(f) == 4 {
			host = f[0]
		} else {
			host = "127.0.0.1"
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(r.Port))
}

// join connects to the launcher's rendezvous and joins the membership round,
// waiting (with heartbeats) until every node has joined. A stop from the
// launcher while waiting ends it with errStopped.
func (a *agent) join(ctx context.Context, cmds <-chan proto.Command, facts *proto.HostFacts) error {
	r := a.asg.Rendezvous
	addr := rendezvousAddr(r, os.Getenv("SSH_CONNECTION"))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, rendezvousDialTimeout)
	c, err := rendezvous.Open(dctx, addr, r.Secret)
	dcancel()
	if err != nil {
		return fmt.Errorf("agent: cannot reach the %s at %s from %s: %w (is a firewall in the way? %s)", rendezvousKind(addr), addr, facts.Hostname, err, rendezvousHint(addr))
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.Join(ctx, r.Name, rendezvous.Facts{Hostname: facts.Hostname, OS: facts.OS, Arch: facts.Arch, CPUs: facts.CPUs, MasterPort: facts.FreePort})
		done <- err
	}()
	return a.waitJoin(ctx, cmds, done)
}

// waitJoin waits for the round to close, answering launcher commands.
func (a *agent) waitJoin(ctx context.Context, cmds <-chan proto.Command, done <-chan error) error {
	beat := time.NewTicker(max(a.asg.Heartbeat(), 100*time.Millisecond))
	defer beat.Stop()
	a.endPulse()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("agent: join rendezvous: %w", err)
			}
			return nil
		case <-ctx.Done():
			return errStopped
		case <-beat.C:
			if a.asg.Heartbeat() > 0 {
				a.beat()
			}
		case c := <-cmds:
			a.heard = time.Now()
			if c.Type == proto.CommandStop || c.Type == proto.CommandKill {
				return errStopped
			}
		}
	}
}

// rankStoreEnv gives ranks the job's rendezvous key-value store (the
// built-in engine's communicators bootstrap through it) at the address
// this agent used, and the job secret in a file only this user can read: a
// secret in the environment would show up in every environment dump. It
// writes the secret file into the agent's temporary directory
// and returns the ranks' GTRAIN_STORE_* variables; none without a
// rendezvous.
func (a *agent) rankStoreEnv() ([]string, error) {
	r := a.asg.Rendezvous
	if r == nil || a.tmpdir == "" {
		return nil, nil
	}
	file := filepath.Join(a.tmpdir, "store.secret")
	if err := os.WriteFile(file, r.Secret, 0o600); err != nil {
		return nil, fmt.Errorf("write the store secret for the ranks: %w", err)
	}
	return []string{
		rankenv.StoreAddr + "=" + rendezvousAddr(r, os.Getenv("SSH_CONNECTION")),
		rankenv.StoreSecretFile + "=" + file,
	}, nil
}

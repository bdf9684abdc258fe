package launch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/launch/proto"
)

// Srun starts each host's agent as a job step of the Slurm allocation the
// launcher runs in: one `srun` per host, one task on that node. One step
// per host rather than one step of every node (--ntasks-per-node=1)
// because each agent speaks the agent protocol over its own stdin and
// stdout, which srun gives a one-task step as its own; a host's step
// failing or being torn down is then that host alone, as with SSH. The
// steps are Slurm's: accounted, in the job's cgroups, cancelled with it,
// and signalled by scancel --signal (the agent forwards SIGUSR1 to its
// ranks as a preemption).
type Srun struct {
	Exe   string   // gtrain's executable: the same path on every node (Slurm clusters share a file system)
	Srun  string   // srun's path; "" = srun on PATH
	JobID string   // the allocation's SLURM_JOB_ID, which each step joins
	Extra []string // more srun options, before the command
	// NodeAddr returns the address of a node (for the agents' rendezvous
	// and MASTER_ADDR); nil = scontrol show node's NodeAddr.
	NodeAddr func(ctx context.Context, node string) (string, error)
}

// NewSrun returns the Srun transport for the allocation getenv describes,
// or an error outside one.
func NewSrun(getenv func(string) string) (*Srun, error) {
	if !hostfiles.InSlurm(getenv) {
		return nil, errors.New("launch: --launcher srun: not inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are unset): run gtrain from an sbatch script or salloc, or use --launcher ssh")
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("launch: find gtrain executable: %w", err)
	}
	return &Srun{Exe: exe, JobID: getenv(hostfiles.SlurmJobID)}, nil
}

// srunArgs is the step that runs host h's agent: one task on that node
// alone (--nodelist), sharing the node's resources with other steps
// (--overlap: the launcher's own step, or a second job in the
// allocation, would otherwise leave it pending), with the job's CPUs
// unbound (gtrain binds the ranks itself), no MPI set-up, output
// unbuffered (the protocol is line by line), named after the run, and
// ended at once by one SIGINT (Kill).
func (s *Srun) srunArgs(h Host, asg *proto.Assignment) []string {
	args := []string{
		"--jobid=" + s.JobID, "--nodes=1", "--ntasks=1", "--nodelist=" + h.Name,
		"--overlap", "--kill-on-bad-exit=1", "--quit-on-interrupt", "--unbuffered", "--quiet",
		"--cpu-bind=none", "--mpi=none", "--job-name=gtrain-" + asg.RunID,
	}
	args = append(args, s.Extra...)
	return append(args, s.Exe, "agent")
}

// Start implements Transport.
func (s *Srun) Start(ctx context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	var local, remote net.Addr
	if !h.Local {
		local, remote = s.route(ctx, h.Name)
		if r := asg.Rendezvous; r != nil && r.Host == "" && local != nil {
			// No SSH_CONNECTION to learn the launcher's address from:
			// tell the agent the address that routes to its node.
			r.Host = hostOnly(local)
		}
	}
	bin := s.Srun
	if bin == "" {
		bin = "srun"
	}
	cmd := exec.Command(bin, s.srunArgs(h, asg)...)
	cmd.SysProcAttr = agentAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	tail := &tailBuffer{max: 4096}
	cmd.Stderr = tail
	if err := cmd.Start(); err != nil {
		return nil, &HostError{Host: h.Name, Op: "start srun for gtrain agent", Err: err}
	}
	c := &srunConn{localConn: localConn{cmd: cmd, stdin: stdin, enc: proto.NewEncoder(stdin), dec: proto.NewDecoder(stdout), tail: tail}}
	if err := c.enc.Encode(asg); err != nil {
		_ = c.Kill()
		_ = c.Close()
		return nil, &HostError{Host: h.Name, Op: "send the assignment through srun", Err: err}
	}
	if local != nil {
		return &srunAddrConn{srunConn: c, local: local, remote: remote}, nil
	}
	return c, nil
}

// route finds the node's address and this machine's address toward it;
// nil, nil when either is unknown (the agent then falls back as the
// rendezvous says, and --rdzv-host or --master-addr set them).
func (s *Srun) route(ctx context.Context, node string) (local, remote net.Addr) {
	lookup := s.NodeAddr
	if lookup == nil {
		lookup = scontrolNodeAddr
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addr, err := lookup(ctx, node)
	if err != nil || addr == "" {
		return nil, nil
	}
	ips, err := net.DefaultResolver.LookupHost(ctx, addr)
	if err != nil || len(ips) == 0 {
		return nil, nil
	}
	// A UDP "connection" sends nothing: it only asks the kernel which
	// source address routes to the node.
	conn, err := net.Dial("udp", net.JoinHostPort(ips[0], "9"))
	if err != nil {
		return nil, nil
	}
	defer conn.Close()
	return conn.LocalAddr(), conn.RemoteAddr()
}

// scontrolNodeAddr is the NodeAddr slurm.conf gives node (its name when
// not set).
func scontrolNodeAddr(ctx context.Context, node string) (string, error) {
	out, err := exec.CommandContext(ctx, "scontrol", "show", "node", "--oneliner", node).Output()
	if err != nil {
		return "", fmt.Errorf("launch: scontrol show node %s: %w", node, err)
	}
	return parseNodeAddr(out), nil
}

// parseNodeAddr reads NodeAddr= from scontrol show node --oneliner output.
func parseNodeAddr(out []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if v, ok := strings.CutPrefix(f, "NodeAddr="); ok {
				return v
			}
		}
	}
	return ""
}

// srunConn is an agent running as a job step, through its srun.
type srunConn struct {
	localConn
	killOnce sync.Once
}

// Kill interrupts srun, which with --quit-on-interrupt ends the step at
// once: Slurm kills the agent and every process of the step (its ranks).
// SIGKILL would end srun alone and leave the step running. srun is
// SIGKILLed after srunKillBackstop if it has not ended by then.
func (c *srunConn) Kill() error {
	c.killOnce.Do(func() {
		p := c.cmd.Process
		_ = p.Signal(syscall.SIGINT)
		t := time.AfterFunc(srunKillBackstop, func() { _ = p.Kill() })
		go func() { _ = c.Close(); t.Stop() }()
	})
	return nil
}

// srunKillBackstop is how long srun has to end its step after Kill.
const srunKillBackstop = 30 * time.Second

// srunAddrConn is a srunConn that knows the node's address and this
// machine's address toward it (see attempt.masterAddr).
type srunAddrConn struct {
	*srunConn
	local, remote net.Addr
}

// LocalAddr is this machine's address toward the node.
func (c *srunAddrConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the node's address.
func (c *srunAddrConn) RemoteAddr() net.Addr { return c.remote }

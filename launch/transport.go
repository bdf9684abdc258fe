package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"

	"github.com/gtrain/gtrain/launch/proto"
)

// Transport starts a node agent on a host and connects to it.
type Transport interface {
	// Start starts `gtrain agent` for host and sends it assignment. The agent
	// connection stays open until Close.
	Start(ctx context.Context, host Host, asg *proto.Assignment) (AgentConn, error)
}

// AgentConn is the launcher's side of one running agent.
type AgentConn interface {
	// Recv returns the agent's next event; io.EOF when its output ends.
	Recv() (proto.Event, error)
	// Send writes a command to the agent.
	Send(c proto.Command) error
	// Kill ends the agent at once (its ranks die by their death signal).
	Kill() error
	// Close closes the agent's input (which alone makes it tear down) and
	// waits for it to exit.
	Close() error
	// Stderr returns the tail of what the agent wrote on its stderr.
	Stderr() string
}

// Mux starts agents on this machine with Local and on other hosts with
// Remote.
type Mux struct {
	Local, Remote Transport
}

// Start implements Transport.
func (m *Mux) Start(ctx context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	if h.Local {
		return m.Local.Start(ctx, h, asg)
	}
	if m.Remote == nil {
		return nil, errors.New("launch: no transport for remote host " + h.Name)
	}
	return m.Remote.Start(ctx, h, asg)
}

// Local starts agents on this machine as child processes: Exe with Args
// (normally gtrain's own executable and "agent").
type Local struct {
	Exe  string
	Args []string
}

// NewLocal returns the Local transport that runs this executable's `agent`.
func NewLocal() (*Local, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("launch: find gtrain executable: %w", err)
	}
	return &Local{Exe: exe, Args: []string{"agent"}}, nil
}

// Start implements Transport.
func (l *Local) Start(ctx context.Context, host Host, asg *proto.Assignment) (AgentConn, error) {
	cmd := exec.Command(l.Exe, l.Args...)
	cmd.SysProcAttr = agentAttr()
	// No cmd.Dir: the agent starts the ranks in assignment.Dir itself, and a Dir
	// here would add PWD to the environment every rank inherits.
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
		return nil, fmt.Errorf("launch: start agent for %s: %w", host.Name, err)
	}
	c := &localConn{cmd: cmd, stdin: stdin, enc: proto.NewEncoder(stdin), dec: proto.NewDecoder(stdout), tail: tail}
	if err := c.enc.Encode(asg); err != nil {
		_ = c.Kill()
		_ = c.Close()
		return nil, fmt.Errorf("launch: send the assignment to the agent for %s: %w", host.Name, err)
	}
	return c, nil
}

// localConn is an agent running as a child process.
type localConn struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	enc   *proto.Encoder
	dec   *proto.Decoder
	tail  *tailBuffer
	once  sync.Once
	err   error
}

func (c *localConn) Recv() (proto.Event, error) {
	var ev proto.Event
	err := c.dec.Decode(&ev)
	return ev, err
}

func (c *localConn) Send(cmd proto.Command) error {
	cmd.V = proto.Version
	return c.enc.Encode(cmd)
}

func (c *localConn) Kill() error { return c.cmd.Process.Kill() }

func (c *localConn) Close() error {
	c.once.Do(func() {
		c.stdin.Close()
		c.err = c.cmd.Wait()
	})
	return c.err
}

func (c *localConn) Stderr() string { return c.tail.String() }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

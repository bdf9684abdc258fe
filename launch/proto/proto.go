// Package proto is the wire protocol between the gtrain launcher and its node
// agents: one JSON object per line, in both directions, versioned by the "v"
// field.
//
// The launcher writes an Assignment as the first line of the agent's stdin, followed
// by zero or more Command lines. The agent writes Event lines on its stdout.
// End of file on the agent's stdin means the launcher is gone: the agent tears
// down every rank it started. Secrets travel only inside the Assignment on stdin,
// never on a command line or in an event.
package proto

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// Version is the protocol version written in every message's "v" field.
// An agent refuses an Assignment of another version.
const Version = 1

// MaxLine is the largest protocol line either side accepts, in bytes.
// Log lines longer than MaxLogLine are split before they are sent.
const MaxLine = 1 << 20

// MaxLogLine is the largest chunk of a rank's output carried by one log event.
const MaxLogLine = 64 << 10

// Event types written by the agent.
const (
	EventJoined      = "joined"       // agent is up: host facts
	EventRankStarted = "rank_started" // a rank's process started: PID
	EventLog         = "log"          // one line of a rank's stdout or stderr
	EventStatus      = "status"       // a JSON status record written by a rank
	EventRankExited  = "rank_exited"  // a rank's process ended: code or signal
	EventHeartbeat   = "heartbeat"    // the agent is alive
	EventError       = "error"        // the agent hit a problem (e.g. a rank could not start)
	EventDone        = "done"         // every rank has ended; the agent exits next
)

// Event types written by the launcher itself (never by an agent), so that
// one stream carries the whole story of a job to the views.
const (
	EventNotice    = "notice"     // a message from gtrain for the user (Message)
	EventJobExited = "job_exited" // the job is over: Code is gtrain's exit code, Message why
	// EventStraggler marks Rank as a straggler (Message: by how much);
	// EventStragglerEnd takes the mark away.
	EventStraggler    = "straggler"
	EventStragglerEnd = "straggler_end"
	// EventHostDropped: an elastic job leaves Host out of its next attempt,
	// or for good (Message: why); EventHostAdded: Host joins the next
	// attempt (a spare, or back after a loss).
	EventHostDropped = "host_dropped"
	EventHostAdded   = "host_added"
	// EventAttempt: an attempt of the job begins, the first or a restart:
	// Attempt is its number, World its ranks (numbered from 0; an elastic
	// restart may change them), Message says so. Views that show ranks
	// forget the ranks of the attempt before.
	EventAttempt = "attempt"
	// EventHostLost: the agent of Host was lost during an attempt (it
	// ended, fell silent, or never joined), elastic job or not; Message:
	// why. Once per host and attempt.
	EventHostLost = "host_lost"
)

// Command types written by the launcher after the Assignment.
const (
	// CommandStop asks the agent to tear down all ranks: SIGTERM (or the
	// command's Signal) to each rank's process group, SIGKILL after the grace
	// period.
	CommandStop = "stop"
	// CommandKill asks for an immediate SIGKILL of every rank's process group
	// (a second Ctrl-C).
	CommandKill = "kill"
	// CommandStart lets an agent whose Assignment has WaitStart start its ranks.
	CommandStart = "start"
	// CommandHeartbeat tells the agent the launcher is alive.
	CommandHeartbeat = "heartbeat"
	// CommandDump asks the agent to send the dump signal (SIGUSR2) to the
	// processes of Ranks, which announced that they take it: each writes its
	// flight record and stacks. Only those: SIGUSR2 kills a program that
	// does not handle it. An agent that does not know it ignores it.
	CommandDump = "dump"
)

// Assignment is what the launcher tells one node agent to run: its ranks, their environment and command, and how to meet the others.
type Assignment struct {
	V           int              `json:"v"`
	RunID       string           `json:"run_id"`
	Attempt     int              `json:"attempt"`
	Node        int              `json:"node"` // node rank: the host's index in the job
	Host        string           `json:"host"` // the host's name as the launcher knows it
	Command     []string         `json:"command"`
	Dir         string           `json:"dir,omitempty"`   // working directory of the ranks; "" = the agent's
	Env         []string         `json:"env,omitempty"`   // KEY=VALUE set for every rank, on top of the agent's environment
	Ranks       []RankAssignment `json:"ranks"`           // the ranks to start on this node, in local-rank order
	GraceMillis int64            `json:"grace_ms"`        // SIGTERM→SIGKILL grace period
	BeatMillis  int64            `json:"heartbeat_ms"`    // heartbeat interval; 0 = none
	StatusFD    bool             `json:"status_fd"`       // give each rank a status pipe (GTRAIN_STATUS_FD)
	Unset       []string         `json:"unset,omitempty"` // variables removed from the agent's environment for the ranks
	ErrorFiles  bool             `json:"error_files"`     // set TORCHELASTIC_ERROR_FILE per rank and report its message
	// WaitStart makes the agent start no rank until a start command arrives:
	// the launcher sends it once every node has joined, so that a host that
	// cannot be reached leaves nothing started anywhere.
	WaitStart bool `json:"wait_start,omitempty"`
	// LauncherBeats promises a heartbeat command every heartbeat interval:
	// an agent that hears nothing for several intervals stops its ranks.
	LauncherBeats bool `json:"launcher_beats,omitempty"`
	// Rendezvous is where the agent must join, authenticated, before it
	// reports joined; nil for none.
	Rendezvous *Rendezvous `json:"rendezvous,omitempty"`
	// Bind is what to bind each rank to (gtrain run --bind: none, gpu,
	// numa, core, auto; "" = none): the agent plans it from the host it
	// detected and applies it as it starts each rank.
	Bind string `json:"bind,omitempty"`
}

// Rendezvous tells an agent how to reach the launcher's rendezvous server.
type Rendezvous struct {
	// Host is the server's address; "" means the launcher's address as this
	// host sees it (the client address in SSH_CONNECTION), else 127.0.0.1.
	Host   string `json:"host,omitempty"`
	Port   int    `json:"port"`
	Secret []byte `json:"secret"` // the per-job secret (base64 in JSON)
	Name   string `json:"name"`   // this node's name in the round
	// Endpoint, when set, is where to meet instead of Host and Port: an
	// etcd endpoint (--rdzv-backend etcd), as rendezvous.Open reads it.
	Endpoint string `json:"endpoint,omitempty"`
}

// RankAssignment is one rank to start.
type RankAssignment struct {
	Rank      int      `json:"rank"`
	LocalRank int      `json:"local_rank"`
	Slot      int      `json:"slot"` // its device slot: the GPU a binding follows
	Env       []string `json:"env"`  // KEY=VALUE specific to this rank (the torchrun contract)
}

// Grace returns the grace period as a duration.
func (s *Assignment) Grace() time.Duration { return time.Duration(s.GraceMillis) * time.Millisecond }

// Heartbeat returns the heartbeat interval as a duration.
func (s *Assignment) Heartbeat() time.Duration { return time.Duration(s.BeatMillis) * time.Millisecond }

// Command is a message from the launcher to an agent after the Assignment.
type Command struct {
	V      int      `json:"v"`
	Type   string   `json:"type"`
	Reason string   `json:"reason,omitempty"`
	Env    []string `json:"env,omitempty"` // start: KEY=VALUE added to every rank (MASTER_ADDR, MASTER_PORT)
	// Signal is, for stop, the signal sent first instead of SIGTERM: the
	// preemption signal the launcher received ("SIGUSR1"), forwarded to the
	// ranks. An agent that does not know it sends SIGTERM.
	Signal string `json:"signal,omitempty"`
	// Ranks are, for dump, the ranks to signal.
	Ranks []int `json:"ranks,omitempty"`
}

// Event is a message from an agent to the launcher. Which fields are set
// depends on Type; Rank is -1 for events that concern the whole node.
type Event struct {
	V     int       `json:"v"`
	Type  string    `json:"type"`
	Time  time.Time `json:"time"`
	Host  string    `json:"host"`
	Node  int       `json:"node"`
	Rank  int       `json:"rank"`
	Local int       `json:"local_rank,omitempty"`

	// joined
	Facts *HostFacts `json:"facts,omitempty"`
	// rank_started
	PID int `json:"pid,omitempty"`
	// log
	Stream  string `json:"stream,omitempty"`  // "stdout" or "stderr"
	Line    string `json:"line,omitempty"`    // without the trailing newline
	Partial bool   `json:"partial,omitempty"` // the line did not end in a newline (EOF or split at MaxLogLine)
	// status
	Status json.RawMessage `json:"status,omitempty"` // the rank's record, a JSON object
	// rank_exited
	Code   int    `json:"code,omitempty"`   // exit code; 128+signal when killed by a signal
	Signal string `json:"signal,omitempty"` // e.g. "SIGKILL" when killed by a signal
	Killed bool   `json:"killed,omitempty"` // the agent signalled it during teardown (and, if a signal ended it, sent that one)
	// PeerFailed: the rank's error file says it failed because a peer died
	// ("peer_failed": true, gtrain's addition to torch's error file).
	PeerFailed bool `json:"peer_failed,omitempty"`
	// rank_exited (from TORCHELASTIC_ERROR_FILE), error, done
	Message string `json:"message,omitempty"`
	// attempt
	Attempt int `json:"attempt,omitempty"`
	World   int `json:"world,omitempty"`
}

// HostFacts describes the host an agent runs on.
type HostFacts struct {
	Hostname string `json:"hostname"`
	OS       string `json:"os"`
	Arch     string `json:"arch"`
	CPUs     int    `json:"cpus"`
	PID      int    `json:"pid"`
	Version  string `json:"version"`
	FreePort int    `json:"free_port,omitempty"` // a TCP port free on this host, for MASTER_PORT on node 0
	// Host is what the agent detected of its host's hardware, so the
	// launcher knows every host without another SSH round; nil from an
	// agent that detected nothing.
	Host *hostinfo.Host `json:"host,omitempty"`
}

// Bounds of a joined event's host facts: each well above any real host
// (Linux's NR_CPUS is at most 8192, its NUMA nodes 1024), so that a
// garbled or hostile line cannot make the launcher plan over millions.
const (
	MaxFactCPUs  = 8192
	MaxFactNUMA  = 1024
	MaxFactGPUs  = 256
	MaxFactNICs  = 1024
	MaxFactNotes = 1024
)

// Check refuses host facts beyond the bounds above, naming the field.
func (f *HostFacts) Check() error {
	h := f.Host
	if h == nil {
		return nil
	}
	bad := func(what string, n, limit int) error {
		return fmt.Errorf("proto: host %s: %d %s in its facts, more than %d: refusing them", f.Hostname, n, what, limit)
	}
	switch {
	case len(h.GPUs) > MaxFactGPUs:
		return bad("GPUs", len(h.GPUs), MaxFactGPUs)
	case len(h.Matrix) > len(h.GPUs):
		return bad("GPU matrix rows", len(h.Matrix), len(h.GPUs))
	case len(h.NUMA) > MaxFactNUMA:
		return bad("NUMA nodes", len(h.NUMA), MaxFactNUMA)
	case len(h.NICs) > MaxFactNICs:
		return bad("NICs", len(h.NICs), MaxFactNICs)
	case len(h.Problems) > MaxFactNotes:
		return bad("problems", len(h.Problems), MaxFactNotes)
	}
	return checkCPULists(f.Hostname, h)
}

// checkCPULists bounds every list of CPU numbers in h, and the numbers.
func checkCPULists(host string, h *hostinfo.Host) error {
	lists := [][]int{h.CPU.Online, h.Cgroup.CPUSet}
	lists = append(lists, h.CPU.Siblings...)
	for _, n := range h.NUMA {
		lists = append(lists, n.CPUs)
	}
	for _, g := range h.GPUs {
		lists = append(lists, g.CPUs)
	}
	if len(lists) > 2*MaxFactCPUs+MaxFactNUMA+MaxFactGPUs {
		return fmt.Errorf("proto: host %s: %d CPU lists in its facts: refusing them", host, len(lists))
	}
	for _, l := range lists {
		if len(l) > MaxFactCPUs {
			return fmt.Errorf("proto: host %s: a list of %d CPUs in its facts, more than %d: refusing them", host, len(l), MaxFactCPUs)
		}
		for _, c := range l {
			if c < 0 || c >= MaxFactCPUs {
				return fmt.Errorf("proto: host %s: CPU %d in its facts: want 0 to %d", host, c, MaxFactCPUs-1)
			}
		}
	}
	return nil
}

// Encoder writes protocol messages as JSON lines. It is safe for concurrent use.
type Encoder struct {
	mu  sync.Mutex
	w   io.Writer
	enc *json.Encoder
}

// NewEncoder returns an Encoder writing to w.
func NewEncoder(w io.Writer) *Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &Encoder{w: w, enc: enc}
}

// Encode writes v as one line.
func (e *Encoder) Encode(v any) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.enc.Encode(v)
}

// Decoder reads protocol messages, one JSON object per line.
type Decoder struct {
	sc   *bufio.Scanner
	line int
}

// NewDecoder returns a Decoder reading from r.
func NewDecoder(r io.Reader) *Decoder {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	return &Decoder{sc: sc}
}

// Decode reads the next line into v and checks its version. It returns
// io.EOF at the end of the input.
func (d *Decoder) Decode(v any) error {
	if !d.sc.Scan() {
		if err := d.sc.Err(); err != nil {
			return fmt.Errorf("proto: line %d: %w", d.line+1, err)
		}
		return io.EOF
	}
	d.line++
	var head struct {
		V int `json:"v"`
	}
	b := d.sc.Bytes()
	if err := json.Unmarshal(b, &head); err != nil {
		return fmt.Errorf("proto: line %d: %w", d.line, err)
	}
	if head.V != Version {
		return fmt.Errorf("proto: line %d: protocol version %d, want %d: use the same gtrain version on every host", d.line, head.V, Version)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("proto: line %d: %w", d.line, err)
	}
	return nil
}

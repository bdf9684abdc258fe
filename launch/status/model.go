package status

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gtrain/gtrain/launch/proto"
)

// maxLastLine is how many characters of a rank's last output line the model
// keeps: enough for any terminal, small enough that a rank printing megabyte
// lines does not bloat every snapshot.
const maxLastLine = 256

// RankInfo is what is known about a rank before it starts.
type RankInfo struct {
	Rank, LocalRank, Node int
	Host                  string
}

// State is the lifecycle state of a rank.
type State int

// The states a rank goes through. A rank starts Pending, becomes Running on
// rank_started and ends in exactly one of Exited, Failed or Stopped.
const (
	Pending State = iota // not started yet
	Running              // process started
	Exited               // ended with code 0 on its own
	Failed               // ended with a non-zero code or a signal not sent by us, or could not start
	Stopped              // signalled by gtrain during teardown (ev.Killed)
)

var stateNames = [...]string{"pending", "running", "exited", "failed", "stopped"}

// String returns the state as a lowercase word: "pending", "running", ….
func (s State) String() string {
	if s < 0 || int(s) >= len(stateNames) {
		return "unknown"
	}
	return stateNames[s]
}

// Ended reports whether s is a final state.
func (s State) Ended() bool { return s >= Exited }

// RankState is the known state of one rank.
type RankState struct {
	RankInfo
	State          State
	PID            int
	Started, Ended time.Time // agent's event times; zero until known
	Code           int
	Signal         string
	LastLine       string   // last non-blank output line (either stream), control characters removed, at most maxLastLine runes
	Step           *int64   // from status records; nil until reported
	Loss           *float64 // from status records; nil until reported
	LR             *float64 // learning rate from status records; nil until reported
	Throughput     string   // e.g. "12.3k tok/s" or "45.0 samples/s"
	Message        string   // error message from rank_exited (error file) or from an error event that kept it from starting
	// Straggler is why the launcher marks the rank as slower than the
	// others (a straggler event); "" when it is not.
	Straggler string

	// The built-in engine's figures (engine/train.Record); nil until
	// reported, and for commands that do not report them.
	ValLoss    *float64 // the last validation loss
	TokensPerS *float64
	StepMillis *float64 // wall time of the last step
	WaitMillis *float64 // of it, blocked in collectives
	Memory     *Memory  // bytes held, by category
	Coord      *Coord   // (dp, pp, tp) under tensor or pipeline parallelism
	// Losses are the last maxLosses training losses, oldest first (the
	// table's sparkline). A new slice on every record: snapshots share it.
	Losses []float64
}

// maxLosses is how many recent losses a RankState keeps.
const maxLosses = 24

// Memory is the bytes a rank holds, by category, as the engine reports them.
type Memory struct {
	Params      int64 `json:"params"`
	Grads       int64 `json:"grads"`
	Optimizer   int64 `json:"optimizer"`
	Activations int64 `json:"activations"`
	Buffers     int64 `json:"buffers"`
	Snapshot    int64 `json:"snapshot"`
	Total       int64 `json:"total"`
}

// Categories are m's categories with their names, Total last.
func (m Memory) Categories() []MemoryCategory {
	return []MemoryCategory{{"params", m.Params}, {"grads", m.Grads}, {"optimizer", m.Optimizer},
		{"activations", m.Activations}, {"buffers", m.Buffers}, {"snapshot", m.Snapshot}, {"total", m.Total}}
}

// MemoryCategory is one named figure of a Memory.
type MemoryCategory struct {
	Name  string
	Bytes int64
}

// Coord is a rank's place in a 3D layout.
type Coord struct {
	DP int `json:"dp"`
	PP int `json:"pp"`
	TP int `json:"tp"`
}

// Model is the job state built from events. It is safe for concurrent use.
// Values behind the pointers in a RankState are never modified after they are
// stored, so snapshots may share them.
type Model struct {
	mu    sync.Mutex
	ranks []RankState // ordered by rank
}

// NewModel returns a model in which every rank in ranks is Pending.
func NewModel(ranks []RankInfo) *Model {
	m := &Model{ranks: make([]RankState, 0, len(ranks))}
	for _, r := range ranks {
		m.ranks = append(m.ranks, RankState{RankInfo: r})
	}
	slices.SortFunc(m.ranks, func(a, b RankState) int { return a.Rank - b.Rank })
	return m
}

// Ranks returns a snapshot copy of every rank's state, ordered by rank.
func (m *Model) Ranks() []RankState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ranks)
}

// Apply updates the model with one event. An attempt event sets the ranks
// (see Model.attempt); other events that concern no rank (joined,
// heartbeat, done, notice, job_exited) leave it unchanged.
func (m *Model) Apply(ev proto.Event) {
	if ev.Type == proto.EventAttempt {
		m.attempt(ev)
		return
	}
	if ev.Rank < 0 {
		return
	}
	switch ev.Type {
	case proto.EventRankStarted, proto.EventLog, proto.EventStatus,
		proto.EventRankExited, proto.EventError, proto.EventStraggler, proto.EventStragglerEnd:
	default:
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rank(ev)
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
	switch ev.Type {
	case proto.EventRankStarted:
		*r = RankState{RankInfo: placed(r.RankInfo, ev), State: Running, PID: ev.PID, Started: at}
	case proto.EventLog:
		if line := cleanLine(ev.Line, maxLastLine); line != "" {
			r.LastLine = line
		}
	case proto.EventStatus:
		applyStatus(r, ev.Status)
	case proto.EventStraggler:
		r.Straggler = ev.Message
	case proto.EventStragglerEnd:
		r.Straggler = ""
	case proto.EventRankExited:
		r.Ended, r.Code, r.Signal, r.Message = at, ev.Code, ev.Signal, ev.Message
		r.State = exitState(ev)
	case proto.EventError:
		// Only an error about a rank that never started decides its fate;
		// a running rank ends with its own rank_exited.
		if r.State == Pending {
			r.RankInfo = placed(r.RankInfo, ev)
			r.State, r.Ended, r.Message = Failed, at, ev.Message
		}
	}
}

// maxWorld bounds an attempt event's ranks, as hostfiles.MaxRanks bounds
// a job's.
const maxWorld = 1 << 16

// attempt sets the ranks to those of the attempt ev starts, 0 to
// ev.World−1, as users of torchrun's elastic agent expect: a restart runs
// a new world, and the ranks of the one before are not in it. Ranks
// beyond the new world are gone (an elastic restart on fewer hosts: the
// notices say which hosts left and why), ranks the model did not know are
// added (a spare joined). A restart's ranks are pending again, their host
// unknown until they start, since an elastic restart may place them on
// other hosts; the first attempt's keep what the model was made with.
func (m *Model) attempt(ev proto.Event) {
	if ev.World <= 0 || ev.World > maxWorld {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ranks := make([]RankState, ev.World)
	for i := range ranks {
		ranks[i].Rank = i
	}
	if ev.Attempt == 0 {
		for _, r := range m.ranks {
			if r.Rank >= 0 && r.Rank < ev.World {
				ranks[r.Rank] = r
			}
		}
	}
	m.ranks = ranks
}

// placed is info with the place ev reports its rank at, where info has
// none (a restart's rank, or one the model was not told about).
func placed(info RankInfo, ev proto.Event) RankInfo {
	if info.Host != "" || ev.Host == "" {
		return info
	}
	return RankInfo{Rank: info.Rank, LocalRank: ev.Local, Node: ev.Node, Host: ev.Host}
}

// exitState classifies a rank_exited event. A rank gtrain signalled is
// Stopped even if it then exited 0: it did not finish on its own.
func exitState(ev proto.Event) State {
	switch {
	case ev.Killed:
		return Stopped
	case ev.Code == 0 && ev.Signal == "":
		return Exited
	default:
		return Failed
	}
}

// rank returns the entry for ev.Rank, adding one (in rank order) for a rank
// the model was not told about, so that no event is lost.
func (m *Model) rank(ev proto.Event) *RankState {
	i, found := slices.BinarySearchFunc(m.ranks, ev.Rank, func(r RankState, rank int) int { return r.Rank - rank })
	if !found {
		info := RankInfo{Rank: ev.Rank, LocalRank: ev.Local, Node: ev.Node, Host: ev.Host}
		m.ranks = slices.Insert(m.ranks, i, RankState{RankInfo: info})
	}
	return &m.ranks[i]
}

// record is a rank's status record. Every field is optional.
type record struct {
	Step        *json.Number `json:"step"`
	Loss        *number      `json:"loss"`
	TokensPerS  *number      `json:"tokens_per_s"`
	SamplesPerS *number      `json:"samples_per_s"`
	LR          *number      `json:"lr"`
	ValLoss     *number      `json:"val_loss"`
	StepMillis  *number      `json:"step_ms"`
	WaitMillis  *number      `json:"comm_wait_ms"`
	Memory      *Memory      `json:"memory"`
	Coord       *Coord       `json:"coord"`
}

// number is a JSON number, or a value JSON cannot write as one: the
// strings "NaN", "Infinity" and "-Infinity" (protobuf's JSON mapping, and
// what the built-in engine writes), also spelt "Inf", "+Inf" or "-Inf" in
// any case. A loss that became NaN must show as NaN, not stop the table.
type number float64

func (n *number) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) != nil {
		return json.Unmarshal(b, (*float64)(n))
	}
	switch strings.ToLower(s) {
	case "nan":
		*n = number(math.NaN())
	case "infinity", "+infinity", "inf", "+inf":
		*n = number(math.Inf(1))
	case "-infinity", "-inf":
		*n = number(math.Inf(-1))
	default:
		return fmt.Errorf("status: %q is not a number", s)
	}
	return nil
}

// float is n as a *float64 (nil stays nil).
func (n *number) float() *float64 {
	if n == nil {
		return nil
	}
	v := float64(*n)
	return &v
}

// applyStatus merges a status record into r. Fields absent from the record
// keep their previous values. A malformed record is ignored as a whole: the
// agent has already told the user about it.
func applyStatus(r *RankState, raw json.RawMessage) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return
	}
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return
	}
	var step *int64
	if rec.Step != nil {
		n, ok := parseStep(*rec.Step)
		if !ok {
			return
		}
		step = &n
	}
	if step != nil {
		r.Step = step
	}
	if rec.Loss != nil {
		r.Loss = rec.Loss.float()
		r.Losses = appendLoss(r.Losses, *r.Loss)
	}
	applyEngine(r, rec)
	if rec.LR != nil {
		r.LR = rec.LR.float()
	}
	switch {
	case rec.TokensPerS != nil:
		r.TokensPerS = rec.TokensPerS.float()
		r.Throughput = formatRate(float64(*rec.TokensPerS), "tok/s")
	case rec.SamplesPerS != nil:
		r.Throughput = formatRate(float64(*rec.SamplesPerS), "samples/s")
	}
}

// parseStep accepts an integer, also written as an integral float ("100.0",
// "1e3"), as Python's json module may produce.
func parseStep(n json.Number) (int64, bool) {
	if i, err := n.Int64(); err == nil {
		return i, true
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

// applyEngine merges the built-in engine's fields of rec into r.
func applyEngine(r *RankState, rec record) {
	if rec.ValLoss != nil {
		r.ValLoss = rec.ValLoss.float()
	}
	if rec.StepMillis != nil {
		r.StepMillis = rec.StepMillis.float()
	}
	if rec.WaitMillis != nil {
		r.WaitMillis = rec.WaitMillis.float()
	}
	if rec.Memory != nil {
		r.Memory = rec.Memory
	}
	if rec.Coord != nil {
		r.Coord = rec.Coord
	}
}

// appendLoss is losses with v added, the oldest dropped past maxLosses, in
// a new slice.
func appendLoss(losses []float64, v float64) []float64 {
	keep := losses[max(0, len(losses)-(maxLosses-1)):]
	out := make([]float64, 0, len(keep)+1)
	return append(append(out, keep...), v)
}

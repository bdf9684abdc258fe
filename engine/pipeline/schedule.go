package pipeline

import (
	"fmt"
	"strings"
)

// Kind names a schedule.
type Kind uint8

const (
	// OneFOneB is 1F1B, PipeDream-Flush: warm-up, one forward one
	// backward, cool-down.
	OneFOneB Kind = iota
	// GPipe runs all forwards, then all backwards.
	GPipe
	// Interleaved is Megatron-LM's interleaved 1F1B over Chunks model
	// chunks per rank.
	Interleaved
)

var kindNames = [...]string{OneFOneB: "1f1b", GPipe: "gpipe", Interleaved: "interleaved"}

// String returns the name ParseKind reads.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ParseKind reads a schedule's name: 1f1b, gpipe or interleaved.
func ParseKind(s string) (Kind, error) {
	for k, name := range kindNames {
		if strings.EqualFold(strings.TrimSpace(s), name) {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("pipeline: schedule %q: want one of %s", s, strings.Join(kindNames[:], ", "))
}

// Bounds on a schedule's sizes, far above any real run, that keep a rank's
// operation list (2·Micros·Chunks entries) small enough to build.
const (
	MaxStages = 1 << 12
	MaxMicros = 1 << 16
	MaxChunks = 1 << 6
)

// Schedule is the order of work of every rank of a pipeline for one
// optimizer step: Stages ranks, Micros micro-batches, Chunks model chunks
// per rank (1 unless Kind is Interleaved). It is pure data: Ops and Steps
// compute a rank's list from these four numbers, the same on every rank.
type Schedule struct {
	Kind   Kind
	Stages int // p, the pipeline ranks
	Micros int // m, the micro-batches (gradient accumulation steps)
	Chunks int // v, the model chunks per rank
}

// New returns the schedule of kind for stages ranks, micros micro-batches
// and chunks model chunks per rank, or why it cannot run.
func New(kind Kind, stages, micros, chunks int) (Schedule, error) {
	s := Schedule{Kind: kind, Stages: stages, Micros: micros, Chunks: chunks}
	return s, s.Validate()
}

// Validate reports a schedule that cannot run.
func (s Schedule) Validate() error {
	switch {
	case s.Kind > Interleaved:
		return fmt.Errorf("pipeline: schedule %s: unknown kind", s.Kind)
	case s.Stages < 1 || s.Stages > MaxStages:
		return fmt.Errorf("pipeline: %s schedule: %d stages: want 1 to %d", s.Kind, s.Stages, MaxStages)
	case s.Micros < 1 || s.Micros > MaxMicros:
		return fmt.Errorf("pipeline: %s schedule: %d micro-batches: want 1 to %d", s.Kind, s.Micros, MaxMicros)
	case s.Kind != Interleaved && s.Chunks != 1:
		return fmt.Errorf("pipeline: %s schedule: %d model chunks per rank: only the interleaved schedule has more than 1", s.Kind, s.Chunks)
	case s.Kind == Interleaved && (s.Chunks < 2 || s.Chunks > MaxChunks):
		return fmt.Errorf("pipeline: interleaved schedule: %d model chunks per rank: want 2 to %d (1 is the 1f1b schedule)", s.Chunks, MaxChunks)
	case s.Kind == Interleaved && s.Stages < 2:
		return fmt.Errorf("pipeline: interleaved schedule: %d stage: interleaving needs at least 2 (use 1f1b)", s.Stages)
	case s.Kind == Interleaved && s.Micros%s.Stages != 0:
		return fmt.Errorf("pipeline: interleaved schedule: %d micro-batches is not a multiple of the %d stages, as Megatron-LM's schedule requires: change the gradient accumulation steps or use 1f1b",
			s.Micros, s.Stages)
	}
	return nil
}

// VirtualStages is the number of virtual stages, Stages·Chunks: the model
// is split into this many runs of layers.
func (s Schedule) VirtualStages() int { return s.Stages * s.Chunks }

// Pass is the direction of an operation or a transfer.
type Pass uint8

const (
	// Forward runs a micro-batch forward; its transfers are activations.
	Forward Pass = iota
	// Backward runs a micro-batch backward; its transfers are gradients.
	Backward
)

// String returns "F" or "B".
func (p Pass) String() string {
	if p == Forward {
		return "F"
	}
	return "B"
}

// Op is one operation of a rank: the forward or backward of micro-batch
// Micro through model chunk Chunk, which is virtual stage Stage =
// Chunk·Stages + rank.
type Op struct {
	Pass  Pass
	Micro int
	Chunk int
	Stage int
}

// String is e.g. "F3" or, with chunks, "B3.1" (micro-batch 3, chunk 1).
func (o Op) String() string {
	return fmt.Sprintf("%s%d.%d", o.Pass, o.Micro, o.Chunk)
}

// Ops returns rank's operations in the order it runs them, 2·Micros·Chunks
// of them. s must be valid and rank in [0, Stages).
func (s Schedule) Ops(rank int) []Op {
	total := s.Micros * s.Chunks
	ops := make([]Op, 0, 2*total)
	w := s.Warmup(rank)
	for k := range w {
		ops = append(ops, s.op(rank, Forward, k))
	}
	for k := range total - w {
		ops = append(ops, s.op(rank, Forward, w+k), s.op(rank, Backward, k))
	}
	for k := total - w; k < total; k++ {
		ops = append(ops, s.op(rank, Backward, k))
	}
	return ops
}

// Warmup is how many forwards rank runs before its first backward, after
// which it alternates a forward and a backward until the forwards run out:
// all of them for GPipe, p−r−1 for 1F1B, (p−r−1)·2 + (v−1)·p chunk
// forwards for interleaved 1F1B (Megatron-LM's count; all of them when
// m = p, as there), never more than there are.
func (s Schedule) Warmup(rank int) int {
	total := s.Micros * s.Chunks
	switch s.Kind {
	case OneFOneB:
		return min(s.Stages-rank-1, total)
	case Interleaved:
		if s.Micros == s.Stages {
			// Megatron-LM runs all forwards first here: the chunks' round
			// trips through the ranks then never wait for each other.
			return total
		}
		return min((s.Stages-rank-1)*2+(s.Chunks-1)*s.Stages, total)
	}
	return total
}

// InFlight is the most micro-batches (of chunks, with Chunks > 1) whose
// forward rank has run and whose backward it has not: the activations it
// holds at once. For 1F1B that is min(p−r, m).
func (s Schedule) InFlight(rank int) int {
	return min(s.Warmup(rank)+1, s.Micros*s.Chunks)
}

// ChunkInFlight is, for each of rank's model chunks, the most micro-batches
// whose forward through that chunk rank has run and whose backward it has
// not: the activation sets a stage that keeps them per chunk allocates
// (model.Stage). With one chunk it is InFlight; with several their sum is
// above InFlight, as the chunks' peaks come at different times.
func (s Schedule) ChunkInFlight(rank int) []int {
	cur, peak := make([]int, s.Chunks), make([]int, s.Chunks)
	for _, op := range s.Ops(rank) {
		if op.Pass == Backward {
			cur[op.Chunk]--
			continue
		}
		cur[op.Chunk]++
		peak[op.Chunk] = max(peak[op.Chunk], cur[op.Chunk])
	}
	return peak
}

// op is rank's k-th operation of pass: micro-batches in order for one
// chunk; with chunks, in groups of Stages micro-batches that go through
// every chunk (forwards from the first chunk, backwards from the last)
// before the next group starts.
func (s Schedule) op(rank int, pass Pass, k int) Op {
	p := s.Stages
	group := p * s.Chunks
	micro := k/group*p + k%p
	chunk := k % group / p
	if pass == Backward {
		chunk = s.Chunks - 1 - chunk
	}
	return Op{Pass: pass, Micro: micro, Chunk: chunk, Stage: chunk*p + rank}
}

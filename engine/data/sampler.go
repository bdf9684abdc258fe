package data

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime/debug"
)

// SamplerConfig configures a Sampler.
type SamplerConfig struct {
	Seed  uint64 // the same seed gives the same batches
	Batch int    // rows per rank and draw (B)
	Seq   int    // tokens per row (T)
	Rank  int    // this rank, in [0, World)
	World int    // data-parallel ranks; the global batch is Batch*World rows
}

// SamplerState is where a Sampler is in its stream of batches, for a
// checkpoint: restoring it continues with exactly the batches an
// uninterrupted run would have drawn.
type SamplerState struct {
	Seed  uint64 `json:"seed"`
	Draws int64  `json:"draws"` // batches drawn so far
}

// Sampler draws nanoGPT-style random windows. Draw n picks the offsets of
// the whole global batch (Batch*World rows) from a generator keyed by (seed,
// n) alone, so a draw does not depend on the draws before it, and rank r
// takes rows [r*Batch, (r+1)*Batch). The union of the ranks' rows is
// therefore the world-size-1 batch of the same global size, and a job
// resumed with another world size but the same global batch sees the same
// data. A Sampler is not safe for concurrent use.
type Sampler struct {
	src   *Tokens
	cfg   SamplerConfig
	draws int64
	pcg   rand.PCG
	rng   *rand.Rand // draws from pcg, reseeded for every draw
}

// NewSampler returns a sampler of windows of src. src must hold at least
// Seq+1 tokens (one window and its shifted targets).
func NewSampler(src *Tokens, cfg SamplerConfig) (*Sampler, error) {
	if src == nil {
		return nil, fmt.Errorf("data: sampler: no tokens")
	}
	if err := checkShape(cfg.Batch, cfg.Seq); err != nil {
		return nil, fmt.Errorf("data: sampler: %w", err)
	}
	switch {
	case cfg.World < 1:
		return nil, fmt.Errorf("data: sampler: world size %d: must be at least 1", cfg.World)
	case cfg.Rank < 0 || cfg.Rank >= cfg.World:
		return nil, fmt.Errorf("data: sampler: rank %d: want 0 to %d for world size %d", cfg.Rank, cfg.World-1, cfg.World)
	case cfg.Batch > math.MaxInt32/cfg.World:
		return nil, fmt.Errorf("data: sampler: global batch %d x %d rows is too large", cfg.Batch, cfg.World)
	case src.Len() < cfg.Seq+1:
		return nil, fmt.Errorf("data: %s: %d tokens, too few for sequence length %d: need at least %d; use more data or a shorter sequence",
			src.Name(), src.Len(), cfg.Seq, cfg.Seq+1)
	}
	s := &Sampler{src: src, cfg: cfg}
	s.rng = rand.New(&s.pcg)
	return s, nil
}

// checkShape checks a batch of b rows of t tokens fits the int32 buffers.
func checkShape(b, t int) error {
	switch {
	case b < 1:
		return fmt.Errorf("batch size %d: must be at least 1", b)
	case t < 1:
		return fmt.Errorf("sequence length %d: must be at least 1", t)
	case b > math.MaxInt32/t:
		return fmt.Errorf("batch %d x sequence %d tokens is too large", b, t)
	}
	return nil
}

// Next fills x with this rank's inputs of the next draw and y with its
// targets (x shifted by one token), each Batch*Seq ids, row after row. It
// does not allocate. A token file that changed under the job is a
// *ChangedError.
func (s *Sampler) Next(x, y []int32) (err error) {
	B, T := s.cfg.Batch, s.cfg.Seq
	if len(x) != B*T || len(y) != B*T {
		return fmt.Errorf("data: sampler: buffers of %d and %d tokens, want %d (batch %d x sequence %d)", len(x), len(y), B*T, B, T)
	}
	if s.src.Len() < T+1 {
		return fmt.Errorf("data: %s: %d tokens, too few for sequence length %d (closed?)", s.src.Name(), s.src.Len(), T)
	}
	if err := s.src.begin(); err != nil {
		return err
	}
	defer s.src.end(&err, debug.SetPanicOnFault(true))
	s.pcg.Seed(mix64(s.cfg.Seed^seedSalt), mix64(uint64(s.draws)^drawSalt))
	n := s.src.Len() - T // offsets in [0, Len-T-1]
	for range s.cfg.Rank * B {
		s.rng.IntN(n) // the rows of the ranks before this one
	}
	for row := range B {
		off := s.rng.IntN(n)
		win := s.src.toks[off : off+T+1]
		xr, yr := x[row*T:(row+1)*T], y[row*T:(row+1)*T]
		for i := range T {
			xr[i], yr[i] = int32(win[i]), int32(win[i+1])
		}
	}
	s.draws++
	return nil
}

// Salts that keep the two halves of the generator's seed apart, and mix64
// (splitmix64's finaliser), which spreads neighbouring seeds and draw
// indices over the generator's whole state. Changing any of them changes the
// batches of every seed: a resumed run would no longer see the data of the
// run it resumes.
const (
	seedSalt = 0x6a09e667f3bcc908
	drawSalt = 0xbb67ae8584caa73b
)

func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// State is where the sampler is, for a checkpoint.
func (s *Sampler) State() SamplerState {
	return SamplerState{Seed: s.cfg.Seed, Draws: s.draws}
}

// Restore continues from st, taken from a sampler's State. The state's seed
// replaces the configured one: a resumed run continues its own stream.
func (s *Sampler) Restore(st SamplerState) error {
	if st.Draws < 0 {
		return fmt.Errorf("data: sampler: restore: %d draws: must not be negative; the checkpoint's sampler state is corrupt", st.Draws)
	}
	s.cfg.Seed, s.draws = st.Seed, st.Draws
	return nil
}

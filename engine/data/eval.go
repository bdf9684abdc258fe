package data

import (
	"fmt"
	"runtime/debug"
)

// EvalSet is the fixed evaluation batches of a validation file, for a
// validation loss comparable from one evaluation to the next: consecutive
// windows of Seq tokens (targets shifted by one), Batch windows per batch,
// from the start of the file. Batch i may be fetched by any rank, e.g. rank
// r of w evaluating batches r, r+w, r+2w, ...
type EvalSet struct {
	src        *Tokens
	batch, seq int
	n          int
}

// EvalBatches returns the evaluation batches of src: as many whole batches
// as it holds, at most maxBatches (no limit when it is 0 or less). A file
// too short for one batch is an error.
func EvalBatches(src *Tokens, batch, seq, maxBatches int) (*EvalSet, error) {
	if src == nil {
		return nil, fmt.Errorf("data: eval: no tokens")
	}
	if err := checkShape(batch, seq); err != nil {
		return nil, fmt.Errorf("data: eval: %w", err)
	}
	windows := (src.Len() - 1) / seq
	n := windows / batch
	if n == 0 {
		return nil, fmt.Errorf("data: %s: %d tokens, too few for one evaluation batch of %d x %d: need at least %d; use more validation data or a smaller batch",
			src.Name(), src.Len(), batch, seq, batch*seq+1)
	}
	if maxBatches > 0 {
		n = min(n, maxBatches)
	}
	return &EvalSet{src: src, batch: batch, seq: seq, n: n}, nil
}

// Len is the number of batches.
func (e *EvalSet) Len() int { return e.n }

// Batch fills x and y (Batch*Seq ids each) with batch i, in [0, Len). A
// token file that changed under the job is a *ChangedError.
func (e *EvalSet) Batch(i int, x, y []int32) (err error) {
	B, T := e.batch, e.seq
	switch {
	case i < 0 || i >= e.n:
		return fmt.Errorf("data: eval: batch %d: want 0 to %d", i, e.n-1)
	case len(x) != B*T || len(y) != B*T:
		return fmt.Errorf("data: eval: buffers of %d and %d tokens, want %d (batch %d x sequence %d)", len(x), len(y), B*T, B, T)
	}
	if err := e.src.begin(); err != nil {
		return err
	}
	defer e.src.end(&err, debug.SetPanicOnFault(true))
	start := i * B * T
	win := e.src.toks[start : start+B*T+1]
	for j := range B * T {
		x[j], y[j] = int32(win[j]), int32(win[j+1])
	}
	return nil
}

package tensorpar

import (
	"context"
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
)

// Embedding is the shape of a vocabulary-parallel token embedding (with a
// replicated position embedding) over a micro-batch of B sequences of T
// tokens, C features, and a vocabulary of V tokens.
type Embedding struct {
	B, T, C, V int
}

// check validates the shape, the tokens and the buffers' sizes.
func (e Embedding) check(g *Group, op string, tokens []int32, wte, wpe, out []float32, rows int) error {
	if e.B < 1 || e.T < 1 || e.C < 1 || e.V < g.size {
		return fmt.Errorf("tensorpar: %s: shape B=%d T=%d C=%d V=%d: need B, T, C ≥ 1 and a vocabulary of at least tp = %d", op, e.B, e.T, e.C, e.V, g.size)
	}
	lo, hi := g.VocabRange(e.V)
	err := errors.Join(checkLen(op, "the tokens", len(tokens), e.B*e.T),
		checkLen(op, "the token embedding shard", len(wte), (hi-lo)*e.C),
		checkLen(op, "the activation", len(out), rows*e.C))
	if wpe != nil && len(wpe) < e.T*e.C {
		err = errors.Join(err, fmt.Errorf("tensorpar: %s: the position embedding has %d elements, fewer than T×C = %d", op, len(wpe), e.T*e.C))
	}
	if err != nil {
		return err
	}
	for i, tok := range tokens {
		if tok < 0 || int(tok) >= e.V {
			return fmt.Errorf("tensorpar: %s: token %d at position %d is outside the vocabulary of %d: does the data match the model's vocab?", op, tok, i, e.V)
		}
	}
	return nil
}

// EmbeddingForward computes out = wte[tokens] + wpe[position] with the
// rows of wte split over the group: wte holds this rank's rows
// VocabRange(V) of the V×C table. Each rank writes the rows of the tokens
// it owns and zeros for the others; the sum over the group (all-reduce, or
// reduce-scatter along the sequence with sequence parallelism) is each
// token's row exactly, a single term and zeros. The position embedding wpe
// (at least T×C; nil for none), whole on every rank, is then added to the
// rows this rank holds. out is B·T×C, or this rank's SequenceRows of it.
func (g *Group) EmbeddingForward(ctx context.Context, e Embedding, out []float32, tokens []int32, wte, wpe []float32) error {
	const op = "vocab-parallel embedding forward"
	N := e.B * e.T
	lo, hi, err := g.SequenceRows(N)
	if err != nil {
		return err
	}
	if err := e.check(g, op, tokens, wte, wpe, out, hi-lo); err != nil {
		return err
	}
	switch {
	case g.size == 1:
		g.lookup(e, out, tokens, wte)
	case g.sp:
		full := g.buf(0, N*e.C)
		g.lookup(e, full, tokens, wte)
		if err := g.comm.ReduceScatter(ctx, comm.F32(full), comm.F32(out), comm.Sum); err != nil {
			return fmt.Errorf("tensorpar: %s: reduce-scatter over tp: %w", op, err)
		}
	default:
		g.lookup(e, out, tokens, wte)
		if err := g.comm.AllReduce(ctx, comm.F32(out), comm.Sum); err != nil {
			return fmt.Errorf("tensorpar: %s: all-reduce over tp: %w", op, err)
		}
	}
	if wpe != nil {
		for i := range hi - lo {
			t := (lo + i) % e.T
			addTo(out[i*e.C:(i+1)*e.C], wpe[t*e.C:(t+1)*e.C])
		}
	}
	return nil
}

// lookup writes into full (N×C) the rows of wte (this rank's shard) of the
// tokens this rank owns, and zeros for the others.
func (g *Group) lookup(e Embedding, full []float32, tokens []int32, wte []float32) {
	lo, hi := g.VocabRange(e.V)
	C := e.C
	for n, tok := range tokens {
		o := full[n*C : (n+1)*C]
		if int(tok) < lo || int(tok) >= hi {
			clear(o)
			continue
		}
		copy(o, wte[(int(tok)-lo)*C:])
	}
}

// EmbeddingBackward accumulates into dwte (this rank's rows) the gradients
// of the tokens this rank owns, and into dwpe (nil: none) the gradient of
// every position, from dout as EmbeddingForward wrote out. Without sequence
// parallelism dout is whole on every rank and there is no communication;
// with it dout is all-gathered first, which also makes dwpe the whole
// gradient on every rank rather than a partial sum.
func (g *Group) EmbeddingBackward(ctx context.Context, e Embedding, dwte, dwpe, dout []float32, tokens []int32) error {
	const op = "vocab-parallel embedding backward"
	N := e.B * e.T
	lo, hi, err := g.SequenceRows(N)
	if err != nil {
		return err
	}
	if err := e.check(g, op, tokens, dwte, dwpe, dout, hi-lo); err != nil {
		return err
	}
	full, err := g.gather(ctx, 0, dout, N, e.C)
	if err != nil {
		return fmt.Errorf("tensorpar: %s: all-gather of the gradient over tp: %w", op, err)
	}
	vlo, vhi := g.VocabRange(e.V)
	C := e.C
	for n, tok := range tokens {
		d := full[n*C : (n+1)*C]
		if int(tok) >= vlo && int(tok) < vhi {
			addTo(dwte[(int(tok)-vlo)*C:(int(tok)-vlo+1)*C], d)
		}
		if dwpe != nil {
			t := n % e.T
			addTo(dwpe[t*C:(t+1)*C], d)
		}
	}
	return nil
}

// addTo adds src to dst element by element.
func addTo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] += v
	}
}

package model

import (
	"fmt"
	"math"

	"github.com/gtrain/gtrain/engine/backend"
)

// Decoder runs a dense model one token at a time for generation: each
// block keeps the queries', keys' and values' projections of the tokens
// seen so far (a KV cache), so that the next token costs one token's
// matmuls and attention over the cache, not a forward pass over the whole
// sequence. Generating N tokens costs O(N) matmul work and O(N²·C) of
// attention dot products, against O(N²) full forwards without a cache.
//
// Its arithmetic is Forward's, on one row: the same backend kernels for the
// embeddings, LayerNorms, matmuls, GELU and residual adds; only the
// attention of the one query is its own loop (Forward's kernel works on
// whole T×T blocks), so its logits match the full forward's within float32
// rounding.
type Decoder struct {
	cfg    Config
	be     backend.Backend
	params []float32
	units  []Unit
	n      int         // positions in the cache
	qkv    [][]float32 // per block: Seq × 3C, the qkv projection of each position

	x, ln, mean, rstd []float32 // the residual stream and a LayerNorm's output (1 × C)
	atty, proj, res2  []float32
	fch, fchGelu      []float32 // 1 × 4C
	scores            []float32 // 1 × Seq
	logits            []float32 // 1 × Vocab
	tok               [1]int32
}

// NewDecoder makes a decoder over params, cfg.NumParams() values in
// Params order (a dense model's Params, or a checkpoint's tensors laid out
// so). It keeps params, which must not change while it is used, and
// allocates its cache: 3 × Layers × Seq × Embd floats.
func NewDecoder(cfg Config, params []float32, be backend.Backend) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(params) != cfg.NumParams() {
		return nil, fmt.Errorf("model: decoder: %d parameters, want %d for this shape", len(params), cfg.NumParams())
	}
	C := cfg.Embd
	d := &Decoder{cfg: cfg, be: be, params: params, units: cfg.Units(), qkv: make([][]float32, cfg.Layers)}
	for l := range d.qkv {
		d.qkv[l] = make([]float32, cfg.Seq*3*C)
	}
	d.x, d.ln, d.atty, d.proj, d.res2 = make([]float32, C), make([]float32, C), make([]float32, C), make([]float32, C), make([]float32, C)
	d.mean, d.rstd = make([]float32, 1), make([]float32, 1)
	d.fch, d.fchGelu = make([]float32, 4*C), make([]float32, 4*C)
	d.scores, d.logits = make([]float32, cfg.Seq), make([]float32, cfg.Vocab)
	return d, nil
}

// Len is the number of tokens in the cache: the position of the next one.
func (d *Decoder) Len() int { return d.n }

// Reset empties the cache.
func (d *Decoder) Reset() { d.n = 0 }

// unit is unit u of the parameters, as a Store would give it.
func (d *Decoder) unit(u int) []float32 {
	x := d.units[u]
	return d.params[x.Offset : x.Offset+x.Size]
}

// Next feeds token tok at position Len() and returns the logits of the
// token after it (Vocab values, valid until the next call). The cache holds
// at most Seq tokens, the model's context: then Next fails, and the caller
// must Reset and feed the part of the context it keeps.
func (d *Decoder) Next(tok int) ([]float32, error) {
	cfg := d.cfg
	if d.n >= cfg.Seq {
		return nil, fmt.Errorf("model: decoder: the cache holds the model's %d positions: reset it", cfg.Seq)
	}
	if tok < 0 || tok >= cfg.Vocab {
		return nil, fmt.Errorf("model: decoder: token %d is outside the vocabulary of %d", tok, cfg.Vocab)
	}
	C, L := cfg.Embd, cfg.Layers
	wte, wpe := cfg.embView(d.unit(0))
	d.tok[0] = int32(tok)
	// One sequence of one token whose position embedding is row n.
	d.be.Encoder(d.x, d.tok[:], wte, wpe[d.n*C:(d.n+1)*C], 1, 1, C)
	for l := range L {
		lw := cfg.blockView(d.unit(1 + l))
		d.block(&lw, l)
	}
	lnfw, lnfb := cfg.finalView(d.unit(L + 1))
	d.be.LayerNorm(d.ln, d.mean, d.rstd, d.x, lnfw, lnfb, 1, C)
	d.be.Matmul(false, true, 1, cfg.Vocab, C, d.ln, C, wte, C, 0, d.logits, cfg.Vocab)
	d.n++
	return d.logits, nil
}

// block is blockForward for the one new token, in place on d.x.
func (d *Decoder) block(lw *layerWeights, l int) {
	be, C := d.be, d.cfg.Embd
	qkv := d.qkv[l][d.n*3*C : (d.n+1)*3*C]
	be.LayerNorm(d.ln, d.mean, d.rstd, d.x, lw.ln1w, lw.ln1b, 1, C)
	be.Matmul(false, false, 1, 3*C, C, d.ln, C, lw.qkvw, 3*C, 0, qkv, 3*C)
	be.AddBias(qkv, lw.qkvb, 1, 3*C)
	d.attend(l)
	be.Matmul(false, false, 1, C, C, d.atty, C, lw.attprojw, C, 0, d.proj, C)
	be.AddBias(d.proj, lw.attprojb, 1, C)
	be.Residual(d.res2, d.x, d.proj)
	be.LayerNorm(d.ln, d.mean, d.rstd, d.res2, lw.ln2w, lw.ln2b, 1, C)
	be.Matmul(false, false, 1, 4*C, C, d.ln, C, lw.fcw, 4*C, 0, d.fch, 4*C)
	be.AddBias(d.fch, lw.fcb, 1, 4*C)
	be.Gelu(d.fchGelu, d.fch)
	be.Matmul(false, false, 1, C, 4*C, d.fchGelu, 4*C, lw.fcprojw, C, 0, d.proj, C)
	be.AddBias(d.proj, lw.fcprojb, 1, C)
	be.Residual(d.x, d.res2, d.proj)
}

// attend is causal self-attention of position n's query over the cached
// keys and values of positions 0..n, head by head, into d.atty.
func (d *Decoder) attend(l int) {
	C, NH, n := d.cfg.Embd, d.cfg.Heads, d.n
	hs, C3 := C/NH, 3*C
	cache := d.qkv[l]
	q := cache[n*C3 : n*C3+C]
	scale := float32(1 / math.Sqrt(float64(hs)))
	s := d.scores[:n+1]
	for h := range NH {
		qh := q[h*hs : (h+1)*hs]
		mx := float32(math.Inf(-1))
		for t := range s {
			k := cache[t*C3+C+h*hs : t*C3+C+(h+1)*hs]
			var dot float32
			for i, qi := range qh {
				dot += qi * k[i]
			}
			s[t] = dot * scale
			mx = max(mx, s[t])
		}
		var sum float32
		for t := range s {
			s[t] = float32(math.Exp(float64(s[t] - mx)))
			sum += s[t]
		}
		out := d.atty[h*hs : (h+1)*hs]
		clear(out)
		inv := 1 / sum
		for t, p := range s {
			v := cache[t*C3+2*C+h*hs : t*C3+2*C+(h+1)*hs]
			w := p * inv
			for i, vi := range v {
				out[i] += w * vi
			}
		}
	}
}

package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/gtrain/gtrain/engine/backend"
)

// Recompute says which activations the backward pass computes again instead
// of keeping them from the forward pass: memory traded for compute.
type Recompute string

// The recomputation modes, as Korthikanti et al. 2022 (Megatron-LM) and the
// planner define them.
const (
	RecomputeNone Recompute = "none" // keep every activation
	// RecomputeSelective keeps every activation but the attention core
	// (the softmax probabilities, B·heads·T² per block), which backward
	// rebuilds from the kept Q, K and V one block at a time.
	RecomputeSelective Recompute = "selective"
	RecomputeFull      Recompute = "full" // keep only each block's input; rerun the block's forward in backward
)

// ParseRecompute accepts the three modes; "" means none.
func ParseRecompute(s string) (Recompute, error) {
	switch r := Recompute(s); r {
	case "":
		return RecomputeNone, nil
	case RecomputeNone, RecomputeSelective, RecomputeFull:
		return r, nil
	}
	return "", fmt.Errorf("model: recompute %q: want none, selective or full", s)
}

// Model is a GPT-2 sized for micro-batches of B sequences of T tokens: its
// activation buffers, and a Store that holds its parameters and gradients.
type Model struct {
	Config    Config
	B, T      int
	Recompute Recompute
	// Params and Grads are the dense store's flat slices, in Config.Params
	// order; nil when another Store holds the parameters.
	Params []float32
	Grads  []float32

	be backend.Backend
	// bw and st16 are the backend and store as bfloat16 weights take
	// them, when both do (else nil); vec holds a block's vectors decoded.
	bw     backend.BF16Weights
	st16   BF16Weights
	vec    []float32
	gw     GradsWriter // the store, if it is one
	params []Param
	store  Store
	acts   activations
	grad   gradScratch
	use    ActivationUse
	x, y   []int32 // the micro-batch of the last Forward
}

// New allocates a model for micro-batches of B×T tokens (T ≤ cfg.Seq) with
// a dense store. Its parameters are zero until Init or a load.
func New(cfg Config, B, T int, be backend.Backend, rc Recompute) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := newDense(cfg)
	m, err := NewWithStore(cfg, B, T, be, rc, d)
	if err != nil {
		return nil, err
	}
	m.Params, m.Grads = d.params, d.grads
	return m, nil
}

// NewWithStore allocates a model whose parameters and gradients st holds.
func NewWithStore(cfg Config, B, T int, be backend.Backend, rc Recompute, st Store) (*Model, error) {
	if err := checkShape(cfg, B, T); err != nil {
		return nil, err
	}
	rc, err := ParseRecompute(string(rc))
	if err != nil {
		return nil, err
	}
	m := &Model{Config: cfg, B: B, T: T, Recompute: rc, be: be, params: cfg.Params(), store: st}
	m.gw, _ = st.(GradsWriter)
	bw, ok := be.(backend.BF16Weights)
	if st16, ok16 := st.(BF16Weights); ok && ok16 && bw.TakesBF16Weights() {
		m.bw, m.st16, m.vec = bw, st16, make([]float32, cfg.blockVectors())
	}
	var z sizer
	m.acts = newActivations(cfg, B, T, rc, &z)
	m.grad = newGradScratch(cfg, B, T, be.AttentionScratch(T), &z)
	m.use = z.use
	return m, nil
}

// Init sets the parameters of a dense model as InitParams does.
func (m *Model) Init(seed uint64) { InitParams(m.Config, seed, m.Params) }

// InitParams fills flat (c.NumParams() long) as GPT-2 initialises its
// parameters, deterministically from seed: weights and embeddings normal
// with std 0.02, the projections into the residual stream (attn.c_proj,
// mlp.c_proj) with std 0.02/sqrt(2·layers), biases zero, LayerNorm gains
// one.
func InitParams(c Config, seed uint64, flat []float32) { InitParamsUntil(c, seed, flat, nil) }

// InitParamsUntil is InitParams that asks stop (when not nil) before each
// tensor and gives up, returning false, when it says so: initialising a
// large model takes seconds to minutes, and a rank asked to stop must not
// go on for that long.
func InitParamsUntil(c Config, seed uint64, flat []float32, stop func() bool) bool {
	rng := rand.New(rand.NewPCG(seed, 0x67747261696e)) // "gtrain"
	projStd := 0.02 / math.Sqrt(2*float64(c.Layers))
	for _, p := range c.Params() {
		if stop != nil && stop() {
			return false
		}
		dst := flat[p.Offset : p.Offset+p.Size()]
		switch {
		case len(p.Shape) == 1 && strings.HasSuffix(p.Name, ".weight"): // LayerNorm gain
			fill(dst, 1)
		case len(p.Shape) == 1:
			fill(dst, 0)
		default:
			std := 0.02
			if strings.HasSuffix(p.Name, "c_proj.weight") {
				std = projStd
			}
			for i := range dst {
				dst[i] = float32(rng.NormFloat64() * std)
			}
		}
	}
	return true
}

func fill(s []float32, v float32) {
	for i := range s {
		s[i] = v
	}
}

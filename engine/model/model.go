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

// The recomputation modes, named as Megatron-LM and the planner name them.
const (
	RecomputeNone      Recompute = "none"      // keep every activation
	RecomputeSelective Recompute = "selective" // recompute the MLP's GELU output (the largest cheap one), as llm.c does
	RecomputeFull      Recompute = "full"      // keep only each block's input; rerun the block's forward in backward
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

// Model is a GPT-2 sized for micro-batches of B sequences of T tokens, with
// its parameters, their gradients and the activation buffers.
type Model struct {
	Config    Config
	B, T      int
	Recompute Recompute
	Params    []float32 // every parameter, in Config.Params order
	Grads     []float32 // their gradients, same layout

	be     backend.Backend
	params []Param
	w, g   weights // views of Params and Grads
	acts   activations
	grad   gradScratch
	x, y   []int32 // the micro-batch of the last Forward
}

// New allocates a model for micro-batches of B×T tokens (T ≤ cfg.Seq). Its
// parameters are zero until Init or a load.
func New(cfg Config, B, T int, be backend.Backend, rc Recompute) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B < 1 || T < 1 || T > cfg.Seq {
		return nil, fmt.Errorf("model: micro-batch %d×%d: want B ≥ 1 and 1 ≤ T ≤ seq (%d)", B, T, cfg.Seq)
	}
	if rc == "" {
		rc = RecomputeNone
	}
	m := &Model{Config: cfg, B: B, T: T, Recompute: rc, be: be, params: cfg.Params()}
	n := cfg.NumParams()
	m.Params = make([]float32, n)
	m.Grads = make([]float32, n)
	m.w = viewWeights(cfg, m.params, m.Params)
	m.g = viewWeights(cfg, m.params, m.Grads)
	m.acts = newActivations(cfg, B, T, rc)
	m.grad = newGradScratch(cfg, B, T, be.AttentionScratch(T))
	return m, nil
}

// ParamList describes the parameters: names, shapes and offsets into Params.
func (m *Model) ParamList() []Param { return m.params }

// Init sets the parameters as GPT-2 initialises them, deterministically from
// seed: weights and embeddings normal with std 0.02, the projections into
// the residual stream (attn.c_proj, mlp.c_proj) with std 0.02/sqrt(2·layers),
// biases zero, LayerNorm gains one.
func (m *Model) Init(seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x67747261696e)) // "gtrain"
	projStd := 0.02 / math.Sqrt(2*float64(m.Config.Layers))
	for _, p := range m.params {
		dst := m.Params[p.Offset : p.Offset+p.Size()]
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
}

// ZeroGrad clears the gradients before a step's first micro-batch.
func (m *Model) ZeroGrad() { clear(m.Grads) }

// Memory is the bytes a model holds, by category.
type Memory struct {
	Params      int64 `json:"params"`
	Grads       int64 `json:"grads"`
	Activations int64 `json:"activations"`
}

// Memory reports m's bytes by category.
func (m *Model) Memory() Memory {
	return Memory{
		Params:      int64(len(m.Params)) * 4,
		Grads:       int64(len(m.Grads)) * 4,
		Activations: (m.acts.floats() + m.grad.floats()) * 4,
	}
}

func fill(s []float32, v float32) {
	for i := range s {
		s[i] = v
	}
}

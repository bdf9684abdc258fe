// Package optim is the engine's optimizer: AdamW with decoupled weight decay
// as PyTorch's torch.optim.AdamW computes it, gradient clipping by global
// norm, and the warmup + cosine learning-rate schedule of nanoGPT.
package optim

import (
	"fmt"
	"math"
)

// Config holds the optimizer's hyperparameters.
type Config struct {
	LR          float64 `json:"lr" mapstructure:"lr"`                     // peak learning rate
	MinLR       float64 `json:"min_lr" mapstructure:"min_lr"`             // floor of the cosine decay
	WarmupSteps int     `json:"warmup_steps" mapstructure:"warmup_steps"` // linear warmup from lr/warmup to lr
	DecaySteps  int     `json:"decay_steps" mapstructure:"decay_steps"`   // end of the cosine (default: the run's steps)
	Beta1       float64 `json:"beta1" mapstructure:"beta1"`
	Beta2       float64 `json:"beta2" mapstructure:"beta2"`
	Eps         float64 `json:"eps" mapstructure:"eps"`
	WeightDecay float64 `json:"weight_decay" mapstructure:"weight_decay"` // on matrices and embeddings only
	GradClip    float64 `json:"grad_clip" mapstructure:"grad_clip"`       // max global gradient norm; 0 disables
}

// Validate reports the first hyperparameter out of range.
func (c Config) Validate() error {
	switch {
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		return fmt.Errorf("optim: lr %g: must be positive", c.LR)
	case c.MinLR < 0 || c.MinLR > c.LR:
		return fmt.Errorf("optim: min_lr %g: must be between 0 and lr (%g)", c.MinLR, c.LR)
	case c.WarmupSteps < 0 || c.DecaySteps < 0:
		return fmt.Errorf("optim: warmup_steps %d, decay_steps %d: must not be negative", c.WarmupSteps, c.DecaySteps)
	case c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1:
		return fmt.Errorf("optim: betas (%g, %g): each must be in [0, 1)", c.Beta1, c.Beta2)
	case !(c.Eps > 0):
		return fmt.Errorf("optim: eps %g: must be positive", c.Eps)
	case c.WeightDecay < 0 || c.GradClip < 0:
		return fmt.Errorf("optim: weight_decay %g, grad_clip %g: must not be negative", c.WeightDecay, c.GradClip)
	}
	return nil
}

// LRAt is the learning rate of step (0-based): linear warmup over
// WarmupSteps, then cosine decay from LR to MinLR until DecaySteps, then
// MinLR (nanoGPT's get_lr).
func (c Config) LRAt(step int) float64 {
	if step < c.WarmupSteps {
		return c.LR * float64(step+1) / float64(c.WarmupSteps+1)
	}
	if step >= c.DecaySteps || c.DecaySteps <= c.WarmupSteps {
		return c.MinLR
	}
	ratio := float64(step-c.WarmupSteps) / float64(c.DecaySteps-c.WarmupSteps)
	coeff := 0.5 * (1 + math.Cos(math.Pi*ratio))
	return c.MinLR + coeff*(c.LR-c.MinLR)
}

// Group is a run of parameters that share a weight decay setting.
type Group struct {
	Offset, Size int
	Decay        bool
}

// AdamW holds the optimizer state: the first and second moments of every
// parameter and the number of steps taken.
type AdamW struct {
	Config Config
	M, V   []float32
	Step   int // steps taken; the bias corrections use Step after increment
	groups []Group
}

// NewAdamW allocates zero moments for n parameters in groups.
func NewAdamW(cfg Config, n int, groups []Group) *AdamW {
	return &AdamW{Config: cfg, M: make([]float32, n), V: make([]float32, n), groups: groups}
}

// Part is a run of parameters updated together: P the parameters, G their
// gradients (len(P) each), At where their moments start in M and V. ZeRO
// updates the parts of the partition a rank owns, which lie in several
// places of the flat parameter layout.
type Part struct {
	P, G  []float32
	At    int
	Decay bool
}

// UpdateParts applies one AdamW step to parts, with the gradients
// multiplied by gradScale first (loss-scale removal and clipping in one
// pass; 1 leaves them as they are, bit for bit).
func (o *AdamW) UpdateParts(parts []Part, lr float64, gradScale float32) {
	o.Step++
	k, decay := o.constants(lr, gradScale)
	for _, pt := range parts {
		k.decay = 1
		if pt.Decay {
			k.decay = decay
		}
		p := pt.P
		adamwUpdate(p, pt.G[:len(p)], o.M[pt.At:pt.At+len(p)], o.V[pt.At:pt.At+len(p)], &k)
	}
}

// GradNorm is the global L2 norm of grads, accumulated in float64.
func GradNorm(grads []float32) float64 {
	var s float64
	for _, g := range grads {
		s += float64(g) * float64(g)
	}
	return math.Sqrt(s)
}

// ClipScale is the factor that brings a gradient of global norm norm to
// at most max, as torch.nn.utils.clip_grad_norm_ computes it
// (max/(norm+1e-6)); 1 when within bounds or max is 0 (no clipping). The
// engine folds it into the update's gradient factor (UpdateParts).
func ClipScale(norm, max float64) float64 {
	if max <= 0 || norm <= max {
		return 1
	}
	return max / (norm + 1e-6)
}

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }

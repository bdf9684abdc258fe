package zero

import (
	"fmt"
	"math"
)

// ScalerConfig is fp16's loss scaling, as DeepSpeed's and PyTorch's
// GradScaler do it: the loss is multiplied by a scale before backward so
// that small gradients survive fp16; a step whose gradients overflowed is
// skipped and the scale halved; after Window steps without overflow it
// doubles.
type ScalerConfig struct {
	InitialScale float64 `json:"initial_scale,omitempty" mapstructure:"initial_scale"` // default 2^16
	Window       int     `json:"window,omitempty" mapstructure:"window"`               // default 1000
	MinScale     float64 `json:"min_scale,omitempty" mapstructure:"min_scale"`         // default 1
	Static       float64 `json:"static,omitempty" mapstructure:"static"`               // > 0: a fixed scale, never changed
}

func (c ScalerConfig) validate() error {
	if c.InitialScale < 0 || c.Window < 0 || c.MinScale < 0 || c.Static < 0 ||
		math.IsInf(c.InitialScale, 0) || math.IsInf(c.Static, 0) {
		return fmt.Errorf("zero: loss scale %+v: values must be finite and not negative", c)
	}
	return nil
}

// ScalerState is the scaler's position, for a checkpoint.
type ScalerState struct {
	Scale   float64 `json:"scale"`
	Good    int     `json:"good"`    // steps since the last overflow or growth
	Skipped int     `json:"skipped"` // steps skipped in the whole run
}

type scaler struct {
	cfg     ScalerConfig
	dynamic bool
	ScalerState
}

func newScaler(c ScalerConfig, fp16 bool) scaler {
	if c.InitialScale == 0 {
		c.InitialScale = 1 << 16
	}
	if c.Window == 0 {
		c.Window = 1000
	}
	if c.MinScale == 0 {
		c.MinScale = 1
	}
	s := scaler{cfg: c, ScalerState: ScalerState{Scale: 1}}
	switch {
	case !fp16:
	case c.Static > 0:
		s.Scale = c.Static
	default:
		s.dynamic, s.Scale = true, c.InitialScale
	}
	return s
}

// update records a step's outcome.
func (s *scaler) update(overflow bool) {
	if overflow {
		s.Skipped++
		s.Good = 0
		if s.dynamic {
			s.Scale = max(s.Scale/2, s.cfg.MinScale)
		}
		return
	}
	if s.Good++; s.dynamic && s.Good >= s.cfg.Window {
		s.Scale *= 2
		s.Good = 0
	}
}

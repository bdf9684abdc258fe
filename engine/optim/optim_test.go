package optim

import (
	"math"
	"testing"
)

func TestLRSchedule(t *testing.T) {
	c := Config{LR: 1e-3, MinLR: 1e-4, WarmupSteps: 10, DecaySteps: 110}
	cases := []struct {
		name string
		step int
		want float64
	}{
		{"first warmup step", 0, 1e-3 / 11},
		{"last warmup step", 9, 1e-3 * 10 / 11},
		{"peak", 10, 1e-3},
		{"half way", 60, 1e-4 + 0.5*(1e-3-1e-4)},
		{"end of decay", 110, 1e-4},
		{"after decay", 500, 1e-4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.LRAt(tc.step); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("LRAt(%d) = %g, want %g", tc.step, got, tc.want)
			}
		})
	}
}

// TestAdamWMatchesFormula checks two steps against torch.optim.AdamW's
// update written out in float64.
func TestAdamWMatchesFormula(t *testing.T) {
	c := Config{LR: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	params := []float32{1, -2, 0.5, 3}
	grads := [][]float32{{0.1, -0.2, 0.3, 0}, {-0.5, 0.25, 0.1, 2}}
	o := NewAdamW(c, 4, []Group{{0, 2, true}, {2, 2, false}})
	ref := make([]float64, 4)
	m, v := make([]float64, 4), make([]float64, 4)
	for i, p := range params {
		ref[i] = float64(p)
	}
	for step, g := range grads {
		o.Update(params, g, c.LR)
		for i := range ref {
			if i < 2 {
				ref[i] *= 1 - c.LR*c.WeightDecay
			}
			gi := float64(g[i])
			m[i] = c.Beta1*m[i] + (1-c.Beta1)*gi
			v[i] = c.Beta2*v[i] + (1-c.Beta2)*gi*gi
			mh := m[i] / (1 - math.Pow(c.Beta1, float64(step+1)))
			vh := v[i] / (1 - math.Pow(c.Beta2, float64(step+1)))
			ref[i] -= c.LR * mh / (math.Sqrt(vh) + c.Eps)
		}
		for i := range ref {
			if math.Abs(float64(params[i])-ref[i]) > 1e-6 {
				t.Errorf("step %d param %d = %v, want %v", step+1, i, params[i], ref[i])
			}
		}
	}
}

func TestClip(t *testing.T) {
	g := []float32{3, 4}
	n := GradNorm(g)
	if n != 5 {
		t.Fatalf("GradNorm = %v, want 5", n)
	}
	if s := Clip(g, n, 10); s != 1 || g[0] != 3 {
		t.Errorf("Clip under the bound changed grads: scale %v, %v", s, g)
	}
	Clip(g, n, 1)
	if got := GradNorm(g); math.Abs(got-1) > 1e-5 {
		t.Errorf("norm after Clip(1) = %v, want 1", got)
	}
}

func TestValidate(t *testing.T) {
	good := Config{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mut := range map[string]func(*Config){
		"zero lr":      func(c *Config) { c.LR = 0 },
		"min over max": func(c *Config) { c.MinLR = 1 },
		"beta1 one":    func(c *Config) { c.Beta1 = 1 },
		"zero eps":     func(c *Config) { c.Eps = 0 },
		"negative wd":  func(c *Config) { c.WeightDecay = -1 },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

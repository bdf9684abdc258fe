package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/usage"
)

// TestRanksOfOtherJobsStop: in-process ranks whose specs differ in a
// setting every rank must share all fail before the first step, each with
// one line naming its own rank, the lowest rank whose spec differs from
// rank 0's, the setting and both values; no rank takes a step.
func TestRanksOfOtherJobsStop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n, odd int // odd: the rank given the other spec
		change func(*Spec)
		want   string
	}{
		{"micro_batch on rank 1", 2, 1, func(s *Spec) { s.Batch.MicroBatch = 4 },
			"batch.micro_batch is 4 on rank 1 but 6 on rank 0"},
		{"precision on rank 2 of 3", 3, 2, func(s *Spec) { s.Precision = "bf16" },
			`precision is "bf16" on rank 2 but "fp32" on rank 0`},
		// Rank 0 is the odd one: every other rank differs from it, and the
		// lowest of them is named.
		{"seed on rank 0 of 3", 3, 0, func(s *Spec) { s.Seed = 7 },
			"seed is 1337 on rank 1 but 7 on rank 0"},
		{"optim.lr on rank 1", 2, 1, func(s *Spec) { s.Optim.LR = 1e-3 },
			"optim.lr is 0.001 on rank 1 but 0.002 on rank 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var steps atomic.Int32
			setHook(t, &testHookStep, func(*Trainer) { steps.Add(1) })
			errs := make([]error, tc.n)
			onRanksAll(t, tc.n, func(ctx context.Context, r int, e Env) {
				s := dpSpec(0, 2)
				if r == tc.odd {
					tc.change(&s)
				}
				_, errs[r] = Run(ctx, s, e)
			})
			for r, err := range errs {
				want := fmt.Sprintf("train: rank %d: job spec check: %s: start every rank with the same job", r, tc.want)
				var ue *usage.Error
				switch {
				case err == nil:
					t.Errorf("rank %d trained on", r)
				case !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "\n"):
					t.Errorf("rank %d: %v\nwant one line starting %q", r, err, want)
				case !errors.As(err, &ue):
					t.Errorf("rank %d: %v: not a usage error", r, err)
				}
			}
			if n := steps.Load(); n != 0 {
				t.Errorf("%d steps started, want none", n)
			}
		})
	}
}

// TestRanksOfOneJobTrain: ranks whose specs differ only where a rank may
// differ (threads, the model named by its preset or by its sizes) pass
// the check and train alike.
func TestRanksOfOneJobTrain(t *testing.T) {
	s := dpSpec(0, 2)
	s.Steps = 2
	res := make([]Result, 2)
	onRanks(t, 2, func(ctx context.Context, r int, c *comm.Communicator) error {
		rs := s
		if r == 1 {
			rs.Threads = 2
			cfg, err := s.ModelConfig()
			if err != nil {
				return err
			}
			rs.Model = ModelSpec{Config: cfg}
		}
		var err error
		res[r], err = Run(ctx, rs, Env{Rank: r, World: 2, LocalWorld: 2, Comm: c})
		return err
	})
	if res[0].Steps != 2 || !slices.Equal(res[0].Losses, res[1].Losses) {
		t.Errorf("rank 0 took %d steps with losses %v, rank 1 %v; want 2 steps, the same losses", res[0].Steps, res[0].Losses, res[1].Losses)
	}
}

// TestFirstDiff: the first setting in the first spec's order that
// differs, nested keys with dots, and a setting one spec lacks.
func TestFirstDiff(t *testing.T) {
	for _, tc := range []struct {
		a, b, key, va, vb string
		ok                bool
	}{
		{`{"x":1,"b":{"c":2,"d":[1,2]}}`, `{"x":1,"b":{"c":2,"d":[1,3]}}`, "b.d", "[1,2]", "[1,3]", true},
		{`{"x":1,"y":2}`, `{"y":3,"x":1}`, "y", "2", "3", true},
		{`{"x":1,"y":2}`, `{"x":1}`, "y", "2", "absent", true},
		{`{"x":1}`, `{"x":1,"z":"new"}`, "z", "absent", `"new"`, true},
		{`{"x":1}`, `{"x":1}`, "", "", "", false},
		{`{"x":`, `{"x":1}`, "", "", "", false},
	} {
		key, va, vb, ok := firstDiff([]byte(tc.a), []byte(tc.b))
		if key != tc.key || va != tc.va || vb != tc.vb || ok != tc.ok {
			t.Errorf("firstDiff(%s, %s) = %q %q %q %v, want %q %q %q %v", tc.a, tc.b, key, va, vb, ok, tc.key, tc.va, tc.vb, tc.ok)
		}
	}
}

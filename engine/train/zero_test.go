package train

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
)

// statusRecords captures each rank's status records.
type statusRecords struct {
	mu   sync.Mutex
	bufs map[int]*bytes.Buffer
}

func (s *statusRecords) env(e *Env) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bufs == nil {
		s.bufs = map[int]*bytes.Buffer{}
	}
	b := &bytes.Buffer{}
	s.bufs[e.Rank] = b
	e.Status = b
}

func (s *statusRecords) of(t *testing.T, rank int) []Record {
	t.Helper()
	var rs []Record
	for _, line := range strings.Split(strings.TrimSpace(s.bufs[rank].String()), "\n") {
		var r Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("rank %d: status record %q: %v", rank, line, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// lowPrecisionBand bounds the relative loss difference between a bf16 or
// fp16 run and the fp32 run over the first 8 steps. bf16 keeps 8
// significant bits (relative rounding 2^-9 ≈ 2e-3 per parameter and per
// gradient element); the loss averages many of them, so it moves far less.
// Measured: at most 1.3e-4 (bf16), 1.1e-5 (fp16, with its 3 more
// mantissa bits); the band allows 2e-3.
const lowPrecisionBand = 2e-3

// TestMixedPrecisionTracksFP32: bf16 and fp16 runs (gradients reduced in
// the low-precision type, half the bytes) stay within lowPrecisionBand of
// fp32, at every stage.
func TestMixedPrecisionTracksFP32(t *testing.T) {
	ref := runRanks(t, dpSpec(0, 2), 2, nil)[0].Losses
	for _, prec := range []string{"bf16", "fp16"} {
		for stage := range 4 {
			t.Run(fmt.Sprintf("%s/stage%d", prec, stage), func(t *testing.T) {
				s := dpSpec(stage, 2)
				s.Precision = prec
				res := runRanks(t, s, 2, nil)[0]
				worst := 0.0
				for i, want := range ref {
					worst = max(worst, relDiff(res.Losses[i], want))
				}
				t.Logf("largest relative loss difference to fp32: %.2g", worst)
				if worst > lowPrecisionBand || res.Skipped > 0 {
					t.Errorf("losses %v, fp32 %v: difference %.2g > %g, or %d skipped steps", res.Losses, ref, worst, lowPrecisionBand, res.Skipped)
				}
			})
		}
	}
}

// TestFP16OverflowSkipsAndRecovers starts fp16 with a loss scale of 2^24,
// at which the gradients overflow fp16: those steps must be skipped, each
// halving the scale, until the scale fits; then training goes on and the
// loss falls as the fp32 run's does.
func TestFP16OverflowSkipsAndRecovers(t *testing.T) {
	s := dpSpec(2, 2)
	s.Steps = 20
	s.Precision = "fp16"
	s.LossScale.InitialScale = 1 << 24
	var recs statusRecords
	res := runRanks(t, s, 2, recs.env)[0]
	rs := recs.of(t, 0)
	skipped := 0
	for i, r := range rs {
		if !r.Skipped {
			continue
		}
		skipped++
		if i > 0 && r.LossScale != rs[i-1].LossScale/2 {
			t.Errorf("step %d skipped: loss scale %g, want half of %g", r.Step, r.LossScale, rs[i-1].LossScale)
		}
	}
	if !rs[0].Skipped || skipped == 0 || skipped != res.Skipped || skipped > s.Steps/2 {
		t.Fatalf("first step skipped %v, %d skipped (result says %d) of %d: want the first steps skipped, then recovery", rs[0].Skipped, skipped, res.Skipped, s.Steps)
	}
	last := rs[len(rs)-1]
	if last.Skipped || !(last.Loss < rs[0].Loss-0.2) {
		t.Errorf("after %d skipped steps the loss went %v → %v: no recovery", skipped, rs[0].Loss, last.Loss)
	}
	t.Logf("%d steps skipped; scale now %g; loss %v → %v", skipped, last.LossScale, rs[0].Loss, last.Loss)
}

// TestModelStateMatchesZeROFormulas: the bytes each rank reports for
// parameters, gradients and optimizer state are the ZeRO paper's
// per-stage model-state formulas (Rajbhandari et al. 2020, §5): with Ψ
// parameters on N ranks, mixed precision holds 2Ψ + 2Ψ + 12Ψ (fp16/bf16
// parameters and gradients; fp32 master, momentum, variance), and fp32
// 4Ψ + 4Ψ + 8Ψ; stage 1 divides the optimizer term by N, stage 2 also the
// gradients, stage 3 also the parameters. Partitions are uneven (DP 3), so
// a rank may hold one element more or less per segment than Ψ/N; summed
// over the ranks the partitioned terms are exact.
func TestModelStateMatchesZeROFormulas(t *testing.T) {
	for _, prec := range []string{"bf16", "fp32"} {
		for stage := range 4 {
			t.Run(fmt.Sprintf("%s/stage%d", prec, stage), func(t *testing.T) {
				const n = 3
				s := dpSpec(stage, n)
				s.Precision, s.Steps = prec, 1
				var recs statusRecords
				runRanks(t, s, n, recs.env)
				cfg, _ := s.ModelConfig()
				psi := int64(cfg.NumParams())
				pb, gb, ob := int64(2), int64(2), int64(12)
				if prec == "fp32" {
					pb, gb, ob = 4, 4, 8
				}
				div := func(bytes int64, from int) int64 { // a term partitioned from stage `from` on
					if stage >= from {
						return bytes / n
					}
					return bytes
				}
				want := MemoryUse{Params: div(pb*psi, 3), Grads: div(gb*psi, 2), Optimizer: div(ob*psi, 1)}
				segments := int64(len(cfg.Units())) // an upper bound on the segments of any stage
				var sum MemoryUse
				for r := range n {
					got := recs.of(t, r)[0].Memory
					for _, c := range []struct {
						name      string
						got, want int64
						elem      int64
					}{{"params", got.Params, want.Params, pb}, {"grads", got.Grads, want.Grads, gb}, {"optimizer", got.Optimizer, want.Optimizer, ob}} {
						if d := c.got - c.want; d < -segments*c.elem || d > segments*c.elem {
							t.Errorf("rank %d: %s %d bytes, ZeRO formula %d (±%d for uneven partitions)", r, c.name, c.got, c.want, segments*c.elem)
						}
					}
					sum.Params += got.Params
					sum.Grads += got.Grads
					sum.Optimizer += got.Optimizer
				}
				for _, c := range []struct {
					name      string
					sum, want int64
					from      int
				}{{"params", sum.Params, pb * psi, 3}, {"grads", sum.Grads, gb * psi, 2}, {"optimizer", sum.Optimizer, ob * psi, 1}} {
					if stage >= c.from && c.sum != c.want {
						t.Errorf("%s summed over ranks: %d bytes, want exactly %d", c.name, c.sum, c.want)
					}
				}
			})
		}
	}
}

// TestReshardContinues saves a checkpoint with 4 ranks at ZeRO stage 3
// and resumes it with 2 ranks at stage 1 and with 3 ranks at stage 2 (the
// micro-batch rescaled so that the global batch stays): the resumed losses
// continue the uninterrupted run's within fp32Tol, and the weights, loaded
// into the new layout and saved again, export to the same safetensors
// bytes.
func TestReshardContinues(t *testing.T) {
	root := t.TempDir()
	spec := func(stage, dp int, dir string) Spec {
		s := dpSpec(stage, dp)
		s.Checkpoint = CkptSpec{Dir: dir, Every: 4}
		return s
	}
	full := runRanks(t, spec(3, 4, filepath.Join(root, "full")), 4, nil)[0].Losses
	src := filepath.Join(root, "src")
	runRanks(t, spec(3, 4, src), 4, func(e *Env) { e.StopAfter = 4 })
	want := exportBytes(t, src)
	for _, to := range []struct{ stage, dp int }{{1, 2}, {2, 3}} {
		t.Run(fmt.Sprintf("stage3dp4→stage%ddp%d", to.stage, to.dp), func(t *testing.T) {
			dir := filepath.Join(root, fmt.Sprintf("to%d", to.dp))
			copyDir(t, src, dir)
			s := spec(to.stage, 4, dir) // the checkpoint's dp and micro-batch; resume refits them
			s.Parallel.DP = 4
			res := runRanks(t, s, to.dp, func(e *Env) { e.Resume = true })
			if res[0].Resumed != 4 {
				t.Fatalf("resumed at step %d, want 4", res[0].Resumed)
			}
			for i, l := range res[0].Losses {
				if d := relDiff(l, full[4+i]); d > fp32Tol {
					t.Errorf("step %d: loss %v, uninterrupted %v (relative %.2g)", 5+i, l, full[4+i], d)
				}
			}
			// Load step 4 into the new layout and save it again elsewhere.
			again := filepath.Join(root, fmt.Sprintf("again%d", to.dp))
			resave(t, s, to.dp, src, again)
			if got := exportBytes(t, again); !bytes.Equal(got, want) {
				t.Errorf("weights of step 4 saved by stage %d dp %d export differently from stage 3 dp 4's", to.stage, to.dp)
			}
		})
	}
}

// resave loads the newest checkpoint of from into n ranks laid out as spec
// says (any tp, pp, dp and ZeRO stage), and saves it into to.
func resave(t *testing.T, spec Spec, n int, from, to string) {
	t.Helper()
	spec.Checkpoint.Dir = from
	onRanks(t, n, func(ctx context.Context, r int, c *comm.Communicator) error {
		tr, err := New(spec, Env{Rank: r, World: n, Comm: c, Resume: true})
		if err != nil {
			return err
		}
		defer tr.Close()
		tr.runCtx = ctx
		if tr.zero != nil { // nil under tp·pp > 1, as in Run
			tr.zero.Bind(ctx)
		}
		release, err := tr.prepareCheckpoints(&Result{})
		if err != nil {
			return err
		}
		defer release()
		tr.spec.Checkpoint.Dir = to
		_, err = tr.SaveCheckpoint()
		return err
	})
}

// exportBytes is the safetensors export of the newest checkpoint in dir.
func exportBytes(t *testing.T, dir string) []byte {
	t.Helper()
	c, err := ckpt.Latest(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "model.safetensors")
	if err := ckpt.Export(t.Context(), c, out, ckpt.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// copyDir copies the checkpoint tree src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

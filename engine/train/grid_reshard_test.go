package train

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/gtrain/gtrain/engine/ckpt"
)

// TestGridReshardExportsIdentical: the checkpoint a tp2·pp2 run wrote at
// step 4, loaded on dp4, tp4, one rank (and others) and saved again there
// without a step, exports (ckpt.Export, as `gtrain ckpt export` does) to
// the very bytes of the tp2·pp2 checkpoint's export: the parameters, and
// with the optimizer option the Adam moments too. So loading into any
// layout and saving from it loses and changes no bit of any tensor. What
// is identical is one checkpoint's state in every layout: a later step's
// checkpoints of the runs continued on each layout are not, since the
// layouts add their float32 sums in other orders (TestGridCheckpointReshards
// checks that their losses continue the uninterrupted run's within
// gridTol). The last case saves the one-rank copy on tp2·pp2 again: a
// round trip through the data-parallel layout back to parts.
func TestGridReshardExportsIdentical(t *testing.T) {
	from := gridLayout{tp: 2, pp: 2, dp: 1, zero: 1}
	src := t.TempDir()
	s := gridSpec(from)
	s.Steps, s.Checkpoint = 8, CkptSpec{Dir: src, Every: 4}
	runRanks(t, s, 4, func(e *Env) { e.StopAfter = 4 })
	want := exports(t, src)
	oneRank := t.TempDir()
	for _, c := range []struct {
		name string
		from string // the checkpoint directory whose newest (step 4) is loaded
		to   gridLayout
		dir  string // where to save; "" for a temporary directory
	}{
		{"dp4", src, gridLayout{tp: 1, pp: 1, dp: 4, zero: 1}, ""},
		{"dp4-zero0", src, gridLayout{tp: 1, pp: 1, dp: 4, zero: 0}, ""},
		{"tp4", src, gridLayout{tp: 4, pp: 1, dp: 1, zero: 0}, ""},
		{"pp3", src, gridLayout{tp: 1, pp: 3, dp: 1, zero: 0}, ""},
		{"tp2-dp2", src, gridLayout{tp: 2, pp: 1, dp: 2, zero: 1}, ""},
		{"one-rank", src, gridLayout{tp: 1, pp: 1, dp: 1}, oneRank},
		{"one-rank-to-tp2pp2", oneRank, from, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := c.dir
			if dir == "" {
				dir = t.TempDir()
			}
			// The checkpoint's spec with l's degrees, as gtrain resume
			// --set gives it: dp and the micro-batch are the writer's.
			rs := gridSpec(c.to)
			rs.Steps, rs.Parallel.DP, rs.Batch.MicroBatch = 8, 1, 4
			n := c.to.tp * c.to.pp * c.to.dp
			resave(t, rs, n, c.from, dir)
			got, err := ckpt.Latest(t.Context(), dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			l := got.Manifest.Layout
			if got.Step() != 4 || l.World != n || max(l.TP, 1) != c.to.tp || max(l.PP, 1) != c.to.pp || l.DP != c.to.dp {
				t.Fatalf("step %d saved by layout %+v, want step 4 by %v on %d ranks", got.Step(), l, c.to, n)
			}
			for i, e := range exports(t, dir) {
				if !bytes.Equal(e, want[i]) {
					t.Errorf("export %d (%d bytes) differs from the tp2·pp2 checkpoint's (%d bytes)", i, len(e), len(want[i]))
				}
			}
		})
	}
}

// exports are the exports of the newest checkpoint in dir: the
// parameters, and the parameters with the optimizer state.
func exports(t *testing.T, dir string) [][]byte {
	t.Helper()
	c, err := ckpt.Latest(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for i, opts := range []ckpt.ExportOptions{{}, {Optimizer: true}} {
		path := filepath.Join(t.TempDir(), "export.safetensors")
		if err := ckpt.Export(t.Context(), c, path, opts); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 || i > 0 && len(b) <= len(out[0]) {
			t.Fatalf("export %+v: %d bytes, the parameters' %d", opts, len(b), len(out[0]))
		}
		out = append(out, b)
	}
	return out
}

package enginejob

import (
	"testing"

	"github.com/gtrain/gtrain/engine/train"
)

// TestResolveDP: the layout gtrain_job_info names is the one the ranks
// run, dp 0 filled in from the world and a checkpoint's dp of another
// world resharded as the ranks reshard it on resume (the global batch,
// micro_batch × dp, kept), and a world the engine refuses left alone.
func TestResolveDP(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		dp, tp, micro, world    int
		wantDP, wantTP, wantMic int
	}{
		{"dp 0 on 4 ranks", 0, 1, 3, 4, 4, 1, 3},
		{"dp 0 with tp 2 on 4 ranks", 0, 2, 3, 4, 2, 2, 3},
		{"resumed from dp 2 on 6 ranks", 2, 1, 3, 6, 6, 1, 1},
		{"resumed from dp 6 on 2 ranks", 6, 1, 1, 2, 2, 1, 3},
		{"same world", 2, 1, 3, 2, 2, 1, 3},
		{"6 sequences do not split over 4", 2, 1, 3, 4, 2, 1, 3},
		{"tp 2 does not divide 3 ranks", 0, 2, 3, 3, 0, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := train.DefaultSpec()
			spec.Parallel.DP, spec.Parallel.TP, spec.Batch.MicroBatch = tc.dp, tc.tp, tc.micro
			got := ResolveDP(spec, tc.world)
			if got.Parallel.DP != tc.wantDP || got.Parallel.TP != tc.wantTP || got.Batch.MicroBatch != tc.wantMic {
				t.Errorf("dp %d tp %d micro_batch %d on %d ranks: dp %d tp %d micro_batch %d, want dp %d tp %d micro_batch %d",
					tc.dp, tc.tp, tc.micro, tc.world, got.Parallel.DP, got.Parallel.TP, got.Batch.MicroBatch, tc.wantDP, tc.wantTP, tc.wantMic)
			}
		})
	}
}

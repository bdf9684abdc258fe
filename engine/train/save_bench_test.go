package train

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
)

// BenchmarkSave times the checkpoint a preempted rank writes before it
// exits (the finiteness check, the rank's safetensors file with sha256, the
// manifest, fsyncs): what --grace-period must leave room for. One rank,
// fp32, ZeRO 0, so the file holds every parameter and both Adam moments.
// GTRAIN_BENCH_PRESETS (comma-separated) picks presets; the default keeps
// to the small ones. docs/bench/save.sh runs it for the table in
// docs/benchmarks.md.
func BenchmarkSave(b *testing.B) {
	presets := []string{"test", "tiny", "small", "gpt2"}
	if s := os.Getenv("GTRAIN_BENCH_PRESETS"); s != "" {
		presets = strings.Split(s, ",")
	}
	for _, p := range presets {
		b.Run(p, func(b *testing.B) {
			spec := DefaultSpec()
			spec.Model.Preset = p
			spec.Batch.MicroBatch, spec.Batch.Seq = 1, 8
			spec.Data.Synthetic = 4096
			spec.Checkpoint.Dir, spec.Checkpoint.Keep = b.TempDir(), 1
			tr, err := NewContext(context.Background(), spec, Env{})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			tr.runCtx = context.Background()
			n := tr.spec.Model.Config.NumParams()
			b.SetBytes(int64(n) * 12) // weights and two moments in fp32
			b.ResetTimer()
			for i := range b.N {
				tr.step = i + 1
				if _, err := tr.save(); err != nil {
					b.Fatal(fmt.Errorf("save step %d: %w", tr.step, err))
				}
			}
			b.ReportMetric(float64(n), "params")
		})
	}
}

package status

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// The cells of the table's columns. Unknown values show as "-".

func pidCell(r RankState, _ *tableContext) string {
	if r.PID == 0 {
		return "-"
	}
	return strconv.Itoa(r.PID)
}

func uptimeCell(r RankState, c *tableContext) string {
	if r.Started.IsZero() {
		return "-"
	}
	end := c.now
	if !r.Ended.IsZero() {
		end = r.Ended
	}
	return formatDuration(end.Sub(r.Started))
}

func stepCell(r RankState, _ *tableContext) string {
	if r.Step == nil {
		return "-"
	}
	return strconv.FormatInt(*r.Step, 10)
}

func lossCell(r RankState, _ *tableContext) string {
	if r.Loss == nil {
		return "-"
	}
	return formatLoss(*r.Loss)
}

func throughputCell(r RankState, _ *tableContext) string {
	if r.Throughput == "" {
		return "-"
	}
	return r.Throughput
}

func coordCell(r RankState, _ *tableContext) string {
	if r.Coord == nil {
		return "-"
	}
	return fmt.Sprintf("%d,%d,%d", r.Coord.DP, r.Coord.PP, r.Coord.TP)
}

// stepTimeCell is the rank's last step time and, where the ranks differ,
// its skew from their median: "120ms +35%". A synchronous job's ranks all
// take as long per step, so the skew shows in the comm wait instead; the
// cell then reads the rank's own work, step time less comm wait, which is
// what the launcher's straggler check compares too.
func stepTimeCell(r RankState, c *tableContext) string {
	ms, ok := ownMillis(r)
	if !ok {
		return "-"
	}
	s := formatMillis(ms)
	if c.medianStep > 0 {
		if d := math.Round(100 * (ms - c.medianStep) / c.medianStep); d >= 5 || d <= -5 {
			s += fmt.Sprintf(" %+.0f%%", d)
		}
	}
	return s
}

// ownMillis is r's work per step: step time less comm wait.
func ownMillis(r RankState) (float64, bool) {
	if r.StepMillis == nil {
		return 0, false
	}
	ms := *r.StepMillis
	if r.WaitMillis != nil {
		ms -= *r.WaitMillis
	}
	return max(ms, 0), true
}

// medianStep is the median of the running ranks' own step times, 0 with
// fewer than two.
func medianStep(ranks []RankState) float64 {
	var v []float64
	for _, r := range ranks {
		if ms, ok := ownMillis(r); ok && r.State == Running {
			v = append(v, ms)
		}
	}
	if len(v) < 2 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func formatMillis(ms float64) string {
	if ms >= 1000 {
		return formatDuration(time.Duration(ms * float64(time.Millisecond)))
	}
	return strconv.FormatFloat(ms, 'f', 0, 64) + "ms"
}

func memoryCell(r RankState, _ *tableContext) string {
	if r.Memory == nil {
		return "-"
	}
	return FormatBytes(r.Memory.Total)
}

// FormatBytes is n in binary units: "512B", "1.5KiB", "12.0MiB", "3.2GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f%ciB", v, "KMGTP"[i])
}

// sparkBlocks are the eight heights of a sparkline.
var sparkBlocks = []rune("▁▂▃▄▅▆▇█")

// sparkline draws values scaled between their minimum and maximum, one
// block each; a value that is not finite is "!". Fewer than two values
// draw nothing: there is no trend yet.
func sparkline(values []float64) string {
	if len(values) < 2 {
		return ""
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range values {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	out := make([]rune, len(values))
	for i, v := range values {
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			out[i] = '!'
		case hi == lo:
			out[i] = sparkBlocks[len(sparkBlocks)/2]
		default:
			out[i] = sparkBlocks[int(math.Round((v-lo)/(hi-lo)*float64(len(sparkBlocks)-1)))]
		}
	}
	return string(out)
}

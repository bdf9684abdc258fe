package status

import (
	"math"
	"strings"
	"testing"
)

// TestChart: a falling series and a sparser second one, each drawn with
// its glyph; the axes carry the extremes, and the legend names both.
func TestChart(t *testing.T) {
	loss := ChartSeries{Name: "train loss", Glyph: '•'}
	for i := 1; i <= 100; i++ {
		loss.X = append(loss.X, float64(i))
		loss.Y = append(loss.Y, 5-4*float64(i-1)/99)
	}
	val := ChartSeries{Name: "val loss", Glyph: 'o', X: []float64{50, 100}, Y: []float64{3.5, math.NaN()}}
	got := Chart([]ChartSeries{loss, val}, "step", 40, 6)
	want := "" +
		"5 ┤••••\n" +
		"  │    •••••••\n" +
		"  │           ••••••o\n" +
		"3 ┤                  •••••••\n" +
		"  │                         ••••••••\n" +
		"1 ┤                                 ••••\n" +
		"  └─────────────────────────────────────\n" +
		"   1                                 100  step\n" +
		"   • train loss   o val loss\n"
	if got != want {
		t.Errorf("chart:\n%s\nwant:\n%s", got, want)
	}
}

func TestChartEmpty(t *testing.T) {
	if got := Chart([]ChartSeries{{Name: "x", Glyph: '*', X: []float64{1}, Y: []float64{math.Inf(1)}}}, "step", 40, 6); !strings.Contains(got, "no data") {
		t.Errorf("chart of nothing finite: %q", got)
	}
	// One point: no range to scale, still drawn.
	if got := Chart([]ChartSeries{{Name: "x", Glyph: '*', X: []float64{3}, Y: []float64{2}}}, "step", 30, 4); !strings.Contains(got, "*") {
		t.Errorf("chart of one point:\n%s", got)
	}
}

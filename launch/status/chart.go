package status

import (
	"math"
	"strconv"
	"strings"
)

// ChartSeries is one series of a Chart: its name, the glyph that draws it
// (the series differ by glyph, never by colour alone) and its points, X
// ascending.
type ChartSeries struct {
	Name  string
	Glyph rune
	X, Y  []float64
}

// Chart draws series as a character plot of width × height cells (at least
// 20 × 4) with y labels (maximum, middle, minimum), an x axis labelled with
// the first and last x, and a legend. Each column shows the mean of the
// points that fall in it, so a noisy loss over many steps reads as its
// trend; later series are drawn over earlier ones. Values that are not
// finite are left out.
//
// It is a few lines of code rather than a library: the terminal charting
// libraries for Go (asciigraph among them) tell series apart by colour,
// which NO_COLOR and a pipe take away.
func Chart(series []ChartSeries, xLabel string, width, height int) string {
	width, height = max(width, 20), max(height, 4)
	xlo, xhi, ylo, yhi, ok := chartBounds(series)
	if !ok {
		return "(no data to chart)\n"
	}
	labels := []string{formatAxis(yhi), formatAxis((ylo + yhi) / 2), formatAxis(ylo)}
	lw := 0
	for _, l := range labels {
		lw = max(lw, len(l))
	}
	w := max(width-lw-2, 10)
	grid := make([][]rune, height)
	for i := range grid {
		grid[i] = []rune(strings.Repeat(" ", w))
	}
	for _, s := range series {
		plot(grid, s, xlo, xhi, ylo, yhi)
	}
	var b strings.Builder
	for i, row := range grid {
		label, tick := "", '│'
		switch i {
		case 0:
			label, tick = labels[0], '┤'
		case height / 2:
			label, tick = labels[1], '┤'
		case height - 1:
			label, tick = labels[2], '┤'
		}
		b.WriteString(strings.Repeat(" ", lw-len(label)) + label + " " + string(tick) + strings.TrimRight(string(row), " ") + "\n")
	}
	b.WriteString(strings.Repeat(" ", lw+1) + "└" + strings.Repeat("─", w) + "\n")
	first, last := formatAxis(xlo), formatAxis(xhi)
	gap := max(1, w-len(first)-len(last))
	b.WriteString(strings.Repeat(" ", lw+2) + first + strings.Repeat(" ", gap) + last + "  " + xLabel + "\n")
	var legend []string
	for _, s := range series {
		legend = append(legend, string(s.Glyph)+" "+s.Name)
	}
	b.WriteString(strings.Repeat(" ", lw+2) + strings.Join(legend, "   ") + "\n")
	return b.String()
}

// chartBounds are the ranges of the series' finite points; ok is false
// without any.
func chartBounds(series []ChartSeries) (xlo, xhi, ylo, yhi float64, ok bool) {
	xlo, ylo = math.Inf(1), math.Inf(1)
	xhi, yhi = math.Inf(-1), math.Inf(-1)
	for _, s := range series {
		for i, y := range s.Y {
			if finiteValue(y) && finiteValue(s.X[i]) {
				xlo, xhi = min(xlo, s.X[i]), max(xhi, s.X[i])
				ylo, yhi = min(ylo, y), max(yhi, y)
				ok = true
			}
		}
	}
	return xlo, xhi, ylo, yhi, ok
}

// plot draws s on grid: each column the mean of its points.
func plot(grid [][]rune, s ChartSeries, xlo, xhi, ylo, yhi float64) {
	w, h := len(grid[0]), len(grid)
	sum, n := make([]float64, w), make([]int, w)
	for i, y := range s.Y {
		if !finiteValue(y) || !finiteValue(s.X[i]) {
			continue
		}
		c := 0
		if xhi > xlo {
			c = int((s.X[i] - xlo) / (xhi - xlo) * float64(w-1))
		}
		sum[c] += y
		n[c]++
	}
	for c := range w {
		if n[c] == 0 {
			continue
		}
		r := h / 2
		if yhi > ylo {
			r = int(math.Round((yhi - sum[c]/float64(n[c])) / (yhi - ylo) * float64(h-1)))
		}
		grid[r][c] = s.Glyph
	}
}

func finiteValue(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// formatAxis is an axis label: an integer as is, else 4 significant digits.
func formatAxis(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e9 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

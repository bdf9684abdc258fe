package status

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/charmbracelet/lipgloss"
)

// formatRate formats v per second in human SI units: "12.3k tok/s",
// "45.0 samples/s"; "NaN tok/s" or "+Inf tok/s" when v is not finite.
func formatRate(v float64, unit string) string {
	const prefixes = " kMGTPE"
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Sprintf("%v %s", v, unit)
	}
	i := 0
	// 999.95 rounds to "1000.0": move to the next prefix instead.
	for math.Abs(v) >= 999.95 && i < len(prefixes)-1 {
		v /= 1000
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.1f %s", v, unit)
	}
	return fmt.Sprintf("%.1f%c %s", v, prefixes[i], unit)
}

// formatLoss formats a loss with four significant digits.
func formatLoss(v float64) string {
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// formatDuration formats d compactly at one-second resolution: "7s",
// "2m05s", "1h02m03s". Negative durations, from clock skew between hosts,
// show as "0s".
func formatDuration(d time.Duration) string {
	s := int64(max(d, 0) / time.Second)
	h, m := s/3600, s/60%60
	s %= 60
	switch {
	case h > 0:
		return fmt.Sprintf("%dh%02dm%02ds", h, m, s)
	case m > 0:
		return fmt.Sprintf("%dm%02ds", m, s)
	default:
		return fmt.Sprintf("%ds", s)
	}
}

// cleanLine makes a rank's output line safe to show inside a table cell: it
// keeps what a terminal would show after the last carriage return (progress
// bars), drops escape sequences and other control characters, turns tabs into
// spaces, trims blanks and keeps at most maxRunes runes.
func cleanLine(s string, maxRunes int) string {
	if i := strings.LastIndexByte(strings.TrimRight(s, "\r"), '\r'); i >= 0 {
		s = s[i+1:]
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(s) && n < maxRunes; {
		if s[i] == 0x1b {
			i = skipEscape(s, i)
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == '\t':
			r = ' '
		case unicode.IsControl(r) || r == unicode.ReplacementChar:
			continue
		}
		b.WriteRune(r)
		n++
	}
	return strings.TrimSpace(b.String())
}

// skipEscape returns the index just past the escape sequence starting at
// s[i] (an ESC): CSI sequences up to their final byte, OSC sequences up to
// BEL or ST, anything else as ESC plus one byte.
func skipEscape(s string, i int) int {
	i++
	if i >= len(s) {
		return i
	}
	switch s[i] {
	case '[':
		for i++; i < len(s); i++ {
			if s[i] >= 0x40 && s[i] <= 0x7e {
				return i + 1
			}
		}
		return i
	case ']':
		for i++; i < len(s); i++ {
			if s[i] == 0x07 {
				return i + 1
			}
			if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\' {
				return i + 2
			}
		}
		return i
	default:
		return i + 1
	}
}

// truncate shortens plain text s to at most width terminal cells, ending in
// "…" when something was cut.
func truncate(s string, width int) string {
	if lipgloss.Width(s) <= width {
		return s
	}
	if width <= 0 {
		return ""
	}
	var b strings.Builder
	used := 0
	for _, r := range s {
		w := lipgloss.Width(string(r))
		if used+w > width-1 {
			break
		}
		b.WriteRune(r)
		used += w
	}
	return b.String() + "…"
}

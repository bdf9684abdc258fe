package status

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestFormatRate(t *testing.T) {
	tests := []struct {
		v    float64
		unit string
		want string
	}{
		{0, "tok/s", "0.0 tok/s"},
		{45, "samples/s", "45.0 samples/s"},
		{999.9, "tok/s", "999.9 tok/s"},
		{999.96, "tok/s", "1.0k tok/s"},
		{12345, "tok/s", "12.3k tok/s"},
		{2.5e6, "tok/s", "2.5M tok/s"},
		{3e9, "tok/s", "3.0G tok/s"},
		{-1500, "tok/s", "-1.5k tok/s"},
		{math.Inf(1), "tok/s", "+Inf tok/s"},
		{math.NaN(), "tok/s", "NaN tok/s"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := formatRate(tt.v, tt.unit); got != tt.want {
				t.Errorf("formatRate(%v) = %q, want %q", tt.v, got, tt.want)
			}
		})
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{1500 * time.Millisecond, "1s"},
		{125 * time.Second, "2m05s"},
		{3723 * time.Second, "1h02m03s"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := formatDuration(tt.d); got != tt.want {
				t.Errorf("formatDuration(%v) = %q, want %q", tt.d, got, tt.want)
			}
		})
	}
}

func TestCleanLine(t *testing.T) {
	tests := []struct {
		name, in, want string
		max            int
	}{
		{"plain", "hello", "hello", 10},
		{"trimmed", "  hi  ", "hi", 10},
		{"carriage return keeps last", "10%\r50%\r", "50%", 10},
		{"sgr removed", "\x1b[1;31merror\x1b[0m", "error", 10},
		{"osc removed", "\x1b]0;title\x07x", "x", 10},
		{"controls removed", "a\x00b\x7fc\td", "abc d", 10},
		{"invalid utf8 removed", "a\xffb", "ab", 10},
		{"limited", "abcdef", "abc", 3},
		{"wide runes counted once", "日本語です", "日本", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cleanLine(tt.in, tt.max); got != tt.want {
				t.Errorf("cleanLine(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	tests := []struct {
		name, in string
		width    int
		want     string
	}{
		{"fits", "abc", 3, "abc"},
		{"cut", "abcdef", 4, "abc…"},
		{"zero", "abc", 0, ""},
		{"one", "abc", 1, "…"},
		{"wide runes", "日本語", 4, "日…"},
		{"long", strings.Repeat("x", 300), 10, strings.Repeat("x", 9) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := truncate(tt.in, tt.width); got != tt.want {
				t.Errorf("truncate(%q, %d) = %q, want %q", tt.in, tt.width, got, tt.want)
			}
		})
	}
}

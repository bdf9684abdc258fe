package status

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/gtrain/gtrain/launch/proto"
)

// engineRec is a status record of the built-in engine.
func engineRec(step int, loss, stepMs, waitMs float64, total int64, dp, pp, tp int) string {
	return fmt.Sprintf(`{"step":%d,"loss":%g,"tokens_per_s":5000,"step_ms":%g,"comm_wait_ms":%g,`+
		`"memory":{"params":1,"total":%d},"coord":{"dp":%d,"pp":%d,"tp":%d}}`, step, loss, stepMs, waitMs, total, dp, pp, tp)
}

// TestTableEngineColumns: with the built-in engine's records the table
// shows each rank's (dp, pp, tp), a sparkline of its losses, its own step
// time (less comm wait) with the skew from the median where it is 5% or
// more, and its memory; a straggler keeps its "running (slow)" mark.
func TestTableEngineColumns(t *testing.T) {
	m := NewModel(threeRanks)
	for r := range 3 {
		m.Apply(started(r, 100+r, 0))
	}
	// Rank 2 works 150 ms a step, the others 100 (the rest is waiting).
	for step, loss := range []float64{4, 3.5, 3, 2.5} {
		m.Apply(statusEv(0, engineRec(step+1, loss, 160, 60, 3<<20, 0, 0, 0)))
		m.Apply(statusEv(1, engineRec(step+1, loss, 160, 60, 3<<20, 0, 0, 1)))
		m.Apply(statusEv(2, engineRec(step+1, loss, 160, 10, 5<<30, 1, 0, 0)))
	}
	m.Apply(proto.Event{Type: proto.EventStraggler, Rank: 2, Message: "1.5x the median"})
	st := newStyles(lipgloss.NewRenderer(&bytes.Buffer{}))
	frame := renderTable(st, m.Ranks(), t0.Add(3*time.Second), layout{width: 160})
	head := strings.SplitN(frame, "\n", 2)[0]
	for _, h := range []string{"DP,PP,TP", "TREND", "STEP TIME", "MEM"} {
		if !strings.Contains(head, h) {
			t.Errorf("no %s column in %q", h, head)
		}
	}
	tests := []struct{ rank, want string }{
		{"0", "0 w0 running 100 3s 4 2.5 0,0,0 █▆▃▁ 5.0k tok/s 100ms 3.0MiB"},
		{"1", "1 w0 running 101 3s 4 2.5 0,0,1 █▆▃▁ 5.0k tok/s 100ms 3.0MiB"},
		{"2", "2 w1 running (slow) 102 3s 4 2.5 1,0,0 █▆▃▁ 5.0k tok/s 150ms +50% 5.0GiB"},
	}
	for _, tt := range tests {
		if got := strings.Join(row(t, frame, tt.rank), " "); got != tt.want {
			t.Errorf("rank %s: row %q, want %q", tt.rank, got, tt.want)
		}
	}
}

// TestTableWithoutEngineColumns: a command that reports only step and loss
// gets today's columns, none of the engine's.
func TestTableWithoutEngineColumns(t *testing.T) {
	m := NewModel(threeRanks)
	m.Apply(statusEv(0, `{"step":1,"loss":2}`))
	st := newStyles(lipgloss.NewRenderer(&bytes.Buffer{}))
	head := strings.SplitN(renderTable(st, m.Ranks(), t0, layout{width: 160}), "\n", 2)[0]
	if got := strings.Join(strings.Fields(head), " "); got != "RANK HOST STATE PID UPTIME STEP LOSS THROUGHPUT LAST LINE" {
		t.Errorf("header %q", got)
	}
}

func TestSparkline(t *testing.T) {
	tests := []struct {
		in   []float64
		want string
	}{
		{nil, ""},
		{[]float64{1}, ""},
		{[]float64{1, 2}, "▁█"},
		{[]float64{2, 2, 2}, "▅▅▅"},
		{[]float64{8, 1, math.NaN(), 4.5}, "█▁!▅"},
	}
	for _, tt := range tests {
		if got := sparkline(tt.in); got != tt.want {
			t.Errorf("sparkline(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestLossesKeptBounded: a rank keeps only its last maxLosses losses.
func TestLossesKeptBounded(t *testing.T) {
	m := NewModel([]RankInfo{{Rank: 0}})
	for i := range 3 * maxLosses {
		m.Apply(statusEv(0, fmt.Sprintf(`{"step":%d,"loss":%d}`, i+1, i)))
	}
	l := m.Ranks()[0].Losses
	if len(l) != maxLosses || l[0] != float64(2*maxLosses) || l[len(l)-1] != float64(3*maxLosses-1) {
		t.Errorf("losses kept %v, want the last %d", l, maxLosses)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1536: "1.5KiB", 12 << 20: "12.0MiB", 5 << 30: "5.0GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

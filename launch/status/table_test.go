package status

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/charmbracelet/lipgloss"

	"github.com/gtrain/gtrain/launch/proto"
)

// lockedBuffer is a bytes.Buffer the test may read while the table's ticker
// goroutine writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

const eraseSeq = "\x1b[J"

// lastFrame returns what term shows after its last erase.
func lastFrame(term string) string {
	if i := strings.LastIndex(term, eraseSeq); i >= 0 {
		return term[i+len(eraseSeq):]
	}
	return term
}

// row returns the fields of the line of frame whose first field is rank.
func row(t *testing.T, frame, rank string) []string {
	t.Helper()
	for line := range strings.Lines(frame) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == rank {
			return f
		}
	}
	t.Fatalf("no row for rank %s in:\n%s", rank, frame)
	return nil
}

var threeRanks = []RankInfo{{Rank: 0, Host: "w0"}, {Rank: 1, Host: "w0", LocalRank: 1}, {Rank: 2, Host: "w1", Node: 1}}

// nowEv stamps ev with the current time, which inside a synctest bubble is
// the fake clock.
func nowEv(ev proto.Event) proto.Event { ev.Time = time.Now(); return ev }

func TestTableRows(t *testing.T) {
	var frame string
	m := NewModel(threeRanks)
	synctest.Test(t, func(t *testing.T) {
		var out, term lockedBuffer
		v := NewTable(&out, &term, m, false, time.Second)
		for _, ev := range []proto.Event{
			started(0, 100, 0), started(1, 101, 0),
			statusEv(0, `{"step":120,"loss":2.5,"tokens_per_s":12345}`),
			logLine(0, "stdout", "epoch 1 done"),
			exited(1, 1, "", false, 0),
		} {
			v.Event(nowEv(ev))
		}
		time.Sleep(2 * time.Second)
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
		frame = lastFrame(term.String())
	})
	if !strings.Contains(frame, "RANK") || !strings.Contains(frame, "LAST LINE") {
		t.Errorf("no header in:\n%s", frame)
	}
	tests := []struct{ rank, want string }{
		{"0", "0 w0 running 100 2s 120 2.5 12.3k tok/s epoch 1 done"},
		{"1", "1 w0 failed (1) 101 0s - - -"},
		{"2", "2 w1 pending - - - - -"},
	}
	for _, tt := range tests {
		t.Run("rank "+tt.rank, func(t *testing.T) {
			if got := strings.Join(row(t, frame, tt.rank), " "); got != tt.want {
				t.Errorf("row = %q, want %q", got, tt.want)
			}
		})
	}
	if got := m.Ranks()[1].State; got != Failed {
		t.Errorf("model not updated by the table: rank 1 is %v", got)
	}
}

func TestTableLinesAbove(t *testing.T) {
	remote := logLine(2, "stderr", "boom")
	remote.Host = "w1"
	tests := []struct {
		name       string
		ev         proto.Event
		multiHost  bool
		sameTerm   bool // out is the terminal too
		wantOut    string
		wantOnTerm string // written after the erase, before the table
	}{
		{"stderr line", logLine(1, "stderr", "boom"), false, false, "", "[rank 1] boom\n"},
		{"partial stderr line", func() proto.Event { e := logLine(1, "stderr", "p"); e.Partial = true; return e }(),
			false, false, "", "[rank 1] p\n"},
		{"notice", proto.Event{Type: proto.EventNotice, Rank: -1, Message: "stopping"}, false, false, "", "gtrain: stopping\n"},
		{"multi-host prefix", remote, true, false, "", "[w1:2] boom\n"},
		{"stdout line elsewhere", logLine(0, "stdout", "hi"), false, false, "[rank 0] hi\n", ""},
		{"stdout line on the terminal", logLine(0, "stdout", "hi"), false, true, "", "[rank 0] hi\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var out, term lockedBuffer
				w := &out
				if tt.sameTerm {
					w = &term
				}
				v := NewTable(w, &term, NewModel(threeRanks), tt.multiHost, time.Second)
				defer v.Close()
				before := term.String()
				v.Event(nowEv(tt.ev))
				if got := out.String(); got != tt.wantOut {
					t.Errorf("out = %q, want %q", got, tt.wantOut)
				}
				added := strings.TrimPrefix(term.String(), before)
				if tt.wantOnTerm == "" {
					if added != "" {
						t.Errorf("terminal written to: %q", added)
					}
					return
				}
				// The table has a header and three ranks: 4 lines up.
				want := "\r\x1b[4A" + eraseSeq + tt.wantOnTerm
				if !strings.HasPrefix(added, want) {
					t.Errorf("terminal got %q, want prefix %q", added, want)
				}
				if !strings.Contains(strings.TrimPrefix(added, want), "RANK") {
					t.Errorf("table not redrawn below the line: %q", added)
				}
			})
		})
	}
}

var sgr = regexp.MustCompile(`\x1b\[[0-9;]*m`)

func TestTableColour(t *testing.T) {
	tests := []struct {
		name    string
		noColor string
		wantSGR bool
	}{
		{"forced colour", "", true},
		{"NO_COLOR", "1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// CLICOLOR_FORCE makes a buffer count as a colour terminal, so
			// the NO_COLOR case shows that NO_COLOR wins.
			t.Setenv("CLICOLOR_FORCE", "1")
			t.Setenv("NO_COLOR", tt.noColor)
			synctest.Test(t, func(t *testing.T) {
				var term lockedBuffer
				v := NewTable(&term, &term, NewModel(threeRanks), false, time.Second)
				v.Event(nowEv(started(0, 1, 0)))
				v.Event(nowEv(exited(1, 2, "", false, 0)))
				v.Event(nowEv(logLine(0, "stdout", "line")))
				if err := v.Close(); err != nil {
					t.Fatal(err)
				}
				got := term.String()
				if sgr.MatchString(got) != tt.wantSGR {
					t.Errorf("SGR present = %v, want %v in %q", !tt.wantSGR, tt.wantSGR, got)
				}
				if !strings.Contains(got, "failed (2)") {
					t.Errorf("state word missing: %q", got)
				}
			})
		})
	}
}

func TestTableWidth(t *testing.T) {
	tests := []struct {
		name, host, line string
		wantEllipsis     bool
	}{
		{"long last line", "w0", strings.Repeat("x", 300), true},
		{"long host", strings.Repeat("h", 150), "short", false},
		{"fits", "w0", "short", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var term lockedBuffer
				v := NewTable(&term, &term, NewModel([]RankInfo{{Rank: 0, Host: tt.host}}), false, time.Second)
				v.Event(nowEv(logLine(0, "stderr", tt.line)))
				if err := v.Close(); err != nil {
					t.Fatal(err)
				}
				frame := lastFrame(term.String())
				for line := range strings.Lines(frame) {
					if w := lipgloss.Width(strings.TrimSuffix(line, "\n")); w > defaultWidth {
						t.Errorf("line is %d wide, want <= %d: %q", w, defaultWidth, line)
					}
				}
				if got := strings.Contains(frame, "x…"); got != tt.wantEllipsis {
					t.Errorf("ellipsis = %v, want %v in:\n%s", got, tt.wantEllipsis, frame)
				}
			})
		})
	}
}

func TestTableTicker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var term lockedBuffer
		v := NewTable(&term, &term, NewModel(threeRanks), false, time.Second)
		defer v.Close()
		v.Event(nowEv(started(0, 1, 0)))
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := row(t, lastFrame(term.String()), "0")[4]; got != "3s" {
			t.Errorf("uptime after 3s = %q, want 3s", got)
		}
	})
}

func TestTableThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var term lockedBuffer
		v := NewTable(&term, &term, NewModel(threeRanks), false, time.Second)
		defer v.Close()
		time.Sleep(500 * time.Millisecond)
		before := term.String()
		v.Event(nowEv(started(0, 1, 0)))
		for i := range 5 {
			v.Event(nowEv(statusEv(0, `{"step":`+strconv.Itoa(i+1)+`}`)))
		}
		if term.String() != before {
			t.Errorf("redrawn within the refresh interval")
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := row(t, lastFrame(term.String()), "0")[5]; got != "5" {
			t.Errorf("step after the tick = %q, want 5", got)
		}
	})
}

func TestTableClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var term lockedBuffer
		v := NewTable(&term, &term, NewModel(threeRanks), false, time.Second)
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
		after := term.String()
		if n := strings.Count(after, "RANK"); n != 2 {
			t.Errorf("%d tables drawn, want the live one and the final one", n)
		}
		v.Event(nowEv(logLine(0, "stderr", "late")))
		if err := v.Close(); err != nil {
			t.Errorf("second Close() = %v", err)
		}
		time.Sleep(5 * time.Second)
		if term.String() != after {
			t.Errorf("written after Close: %q", strings.TrimPrefix(term.String(), after))
		}
	})
	t.Run("write error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			v := NewTable(failWriter{}, failWriter{}, NewModel(threeRanks), false, time.Second)
			if err := v.Close(); err == nil {
				t.Error("Close() = nil, want the write error")
			}
		})
	})
}

func TestRenderHeight(t *testing.T) {
	ranks := make([]RankState, 10)
	for i := range ranks {
		ranks[i] = RankState{RankInfo: RankInfo{Rank: i, Host: "w0"}}
	}
	ranks[9].State = Running
	st := newStyles(lipgloss.NewRenderer(&bytes.Buffer{}))
	tests := []struct {
		name      string
		height    int
		wantLines int
		wantMore  string
	}{
		{"unlimited", 0, 11, ""},
		{"tall enough", 20, 11, ""},
		{"too short", 6, 5, "… 7 more ranks: 6 pending, 1 running"},
		{"tiny", 2, 3, "… 9 more ranks: 8 pending, 1 running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := renderTable(st, ranks, t0, layout{width: 100, height: tt.height})
			if n := strings.Count(got, "\n"); n != tt.wantLines {
				t.Errorf("%d lines, want %d:\n%s", n, tt.wantLines, got)
			}
			if tt.wantMore != "" && !strings.HasSuffix(got, tt.wantMore+"\n") {
				t.Errorf("last line not %q:\n%s", tt.wantMore, got)
			}
		})
	}
}

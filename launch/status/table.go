package status

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/lipgloss"
	xterm "golang.org/x/term"

	"github.com/gtrain/gtrain/launch/proto"
)

// defaultWidth is the table width when the terminal's cannot be read.
const defaultWidth = 100

// defaultRefresh is used when NewTable is given no refresh interval.
const defaultRefresh = 250 * time.Millisecond

// NewTable returns a view that draws a live per-rank status table on term
// (stderr, a TTY) and applies every event to m. The table is redrawn when m
// changes, at most every refresh, and on a ticker of that period so that
// uptimes move. Its columns are rank, host, state, pid, uptime, step, loss,
// throughput and last line, and, once some rank reports them (the built-in
// engine does), its (dp, pp, tp), a sparkline of its recent losses, its own
// step time with the skew from the median, and its memory (see columns);
// the last line is cut to fit the terminal's width
// (100 if term is not a terminal *os.File), and when the terminal is too
// short for every rank the rest are counted in one line.
//
// Rank output and notices are printed above the table, prefixed as by
// NewLines: stdout lines to out, stderr lines and notices to term. The table
// is erased (cursor up, clear to end of screen) and redrawn around a line
// only if that line goes to the terminal, so stdout redirected to a file
// costs no redraws.
//
// Colour goes through a lipgloss renderer made for term, so NO_COLOR and
// CLICOLOR_FORCE apply to it; the state is always a word. Close stops the
// ticker, erases the live table and prints one final static table with every
// rank. Events after Close are ignored.
func NewTable(out, term io.Writer, m *Model, multiHost bool, refresh time.Duration) View {
	if refresh <= 0 {
		refresh = defaultRefresh
	}
	v := &tableView{
		out: out, term: term, m: m, multiHost: multiHost, refresh: refresh,
		st:        newStyles(lipgloss.NewRenderer(term)),
		outOnTerm: out == term || isTerminal(out),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	v.mu.Lock()
	v.update(time.Now(), true)
	v.mu.Unlock()
	go v.loop(time.NewTicker(refresh))
	return v
}

// tableView is the live table. Event and the ticker goroutine share all of
// its state under mu.
type tableView struct {
	mu        sync.Mutex
	out, term io.Writer
	m         *Model
	multiHost bool
	refresh   time.Duration
	st        *styles
	outOnTerm bool // out is the terminal too: stdout lines need the table erased

	frame    string    // the live table as last rendered
	lines    int       // lines of the table now on the terminal; 0 if none
	rendered time.Time // when frame was rendered
	dirty    bool      // m changed since frame was rendered
	closed   bool
	err      error // first write error

	stop chan struct{} // closed by Close to end loop
	done chan struct{} // closed by loop when it ends
}

func (v *tableView) Event(ev proto.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return
	}
	v.m.Apply(ev)
	v.dirty = true
	w, line := routeLine(ev, v.out, v.term, v.multiHost)
	switch {
	case w == nil:
		v.update(time.Now(), false)
	case w == v.term || v.outOnTerm:
		v.printAbove(w, line)
	default:
		v.write(w, line)
		v.update(time.Now(), false)
	}
}

// printAbove erases the table, writes line to w and draws the table again,
// re-rendered if it is due. Cheap when not due: the frame is reused.
func (v *tableView) printAbove(w io.Writer, line []byte) {
	now := time.Now()
	if v.dirty && now.Sub(v.rendered) >= v.refresh {
		v.render(now)
	}
	b := v.erase()
	if w == v.term {
		b = append(b, line...)
	} else {
		v.write(v.term, b)
		v.write(w, line)
		b = nil
	}
	v.draw(b)
}

// update re-renders the table if force is set or the model changed and the
// last render is at least refresh old, and redraws it if it looks different.
func (v *tableView) update(now time.Time, force bool) {
	if !force && (!v.dirty || now.Sub(v.rendered) < v.refresh) {
		return
	}
	old := v.frame
	v.render(now)
	if v.frame != old || v.lines == 0 {
		v.draw(v.erase())
	}
}

func (v *tableView) render(now time.Time) {
	v.frame = renderTable(v.st, v.m.Ranks(), now, termLayout(v.term))
	v.rendered, v.dirty = now, false
}

// draw writes b followed by the frame in one write, so the terminal never
// shows the table half drawn.
func (v *tableView) draw(b []byte) {
	v.write(v.term, append(b, v.frame...))
	v.lines = strings.Count(v.frame, "\n")
}

// erase returns the sequence that erases the drawn table: back to the start
// of its first line, then clear to the end of the screen. The table never
// wraps (it is cut to the width) so its line count is its height.
func (v *tableView) erase() []byte {
	if v.lines == 0 {
		return nil
	}
	n := v.lines
	v.lines = 0
	return []byte("\r\x1b[" + strconv.Itoa(n) + "A\x1b[J")
}

func (v *tableView) write(w io.Writer, b []byte) {
	if len(b) == 0 {
		return
	}
	if _, err := w.Write(b); err != nil && v.err == nil {
		v.err = fmt.Errorf("status: write table: %w", err)
	}
}

// loop redraws the table every tick until Close.
func (v *tableView) loop(t *time.Ticker) {
	defer close(v.done)
	defer t.Stop()
	for {
		select {
		case <-v.stop:
			return
		case <-t.C:
			v.mu.Lock()
			if !v.closed {
				v.update(time.Now(), true)
			}
			v.mu.Unlock()
		}
	}
}

func (v *tableView) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	v.mu.Unlock()
	close(v.stop)
	<-v.done

	v.mu.Lock()
	defer v.mu.Unlock()
	lay := termLayout(v.term)
	lay.height = 0 // the final table is static: it may scroll
	v.frame = renderTable(v.st, v.m.Ranks(), time.Now(), lay)
	v.draw(v.erase())
	v.lines = 0
	return v.err
}

// termLayout returns the size of w if it is a terminal, else defaultWidth
// and no height limit.
func termLayout(w io.Writer) layout {
	if f, ok := w.(*os.File); ok {
		if width, height, err := xterm.GetSize(int(f.Fd())); err == nil && width > 0 {
			return layout{width: width, height: height}
		}
	}
	return layout{width: defaultWidth}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && xterm.IsTerminal(int(f.Fd()))
}

package status

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/lipgloss/table"
)

// headers are the table's columns. The last one takes what width is left.
var headers = []string{"RANK", "HOST", "STATE", "PID", "UPTIME", "STEP", "LOSS", "THROUGHPUT", "LAST LINE"}

const lastCol = 8

// rightAligned marks the numeric columns.
var rightAligned = map[int]bool{0: true, 3: true, 4: true, 5: true, 6: true, 7: true}

// styles holds the table's styles, made through the terminal's renderer so
// that colour follows the terminal (and NO_COLOR), not stdout.
type styles struct {
	r      *lipgloss.Renderer
	header lipgloss.Style
	cell   lipgloss.Style
	state  map[State]lipgloss.Style
}

func newStyles(r *lipgloss.Renderer) *styles {
	cell := r.NewStyle().PaddingRight(2)
	// Basic ANSI colours read on dark and light backgrounds alike, and
	// avoid querying the terminal for its background.
	color := func(c string) lipgloss.Style { return cell.Foreground(lipgloss.Color(c)) }
	return &styles{
		r:      r,
		header: cell.Bold(true),
		cell:   cell,
		state: map[State]lipgloss.Style{
			Pending: cell.Faint(true),
			Running: color("2"),
			Exited:  color("4"),
			Failed:  color("1").Bold(true),
			Stopped: color("3"),
		},
	}
}

// layout is the space the table may use. height 0 means unlimited.
type layout struct{ width, height int }

// renderTable renders ranks as a table no wider than lay.width, newline
// terminated. If lay.height is set and too small for every rank, the first
// ranks that fit are shown followed by a line counting the rest by state.
func renderTable(st *styles, ranks []RankState, now time.Time, lay layout) string {
	var more string
	if maxRows := lay.height - 3; lay.height > 0 && len(ranks) > maxRows {
		maxRows = max(maxRows, 1)
		more = truncate(summary(ranks[maxRows:]), lay.width) + "\n"
		ranks = ranks[:maxRows]
	}
	rows := make([][]string, len(ranks))
	for i, r := range ranks {
		rows[i] = rowCells(r, now)
	}
	// Lay out once without the last line column's contents to learn how
	// much width it can have.
	full := make([]string, len(rows))
	for i, row := range rows {
		full[i], row[lastCol] = row[lastCol], ""
	}
	spare := lay.width - lipgloss.Width(buildTable(st, ranks, rows).Render())
	room := lipgloss.Width(headers[lastCol]) + spare
	for i, row := range rows {
		row[lastCol] = truncate(full[i], room)
	}
	out := buildTable(st, ranks, rows).Render()
	if lipgloss.Width(out) > lay.width {
		// Even without a last line the row is too wide: cut every line so
		// none wraps, which would break erasing the table.
		out = st.r.NewStyle().MaxWidth(lay.width).Render(out)
	}
	return out + "\n" + more
}

// Borderless is gtrain's table shape, the live status table's and every
// result table's (ckpt ls, hosts check, plan): no borders or rules, no
// wrapping; the caller adds headers, rows and styles (padding included).
func Borderless() *table.Table {
	return table.New().
		Border(lipgloss.HiddenBorder()).
		BorderTop(false).BorderBottom(false).BorderLeft(false).BorderRight(false).
		BorderHeader(false).BorderColumn(false).
		Wrap(false)
}

func buildTable(st *styles, ranks []RankState, rows [][]string) *table.Table {
	return Borderless().
		Headers(headers...).
		Rows(rows...).
		StyleFunc(func(row, col int) lipgloss.Style {
			s := st.cell
			switch {
			case row == table.HeaderRow:
				s = st.header
			case col == 2:
				s = st.state[ranks[row].State]
			}
			if col == lastCol {
				s = s.UnsetPaddingRight()
			}
			if rightAligned[col] {
				s = s.Align(lipgloss.Right)
			}
			return s
		})
}

// rowCells returns the text of r's cells. Unknown values show as "-".
func rowCells(r RankState, now time.Time) []string {
	pid, uptime, step, loss := "-", "-", "-", "-"
	if r.PID != 0 {
		pid = strconv.Itoa(r.PID)
	}
	if !r.Started.IsZero() {
		end := now
		if !r.Ended.IsZero() {
			end = r.Ended
		}
		uptime = formatDuration(end.Sub(r.Started))
	}
	if r.Step != nil {
		step = strconv.FormatInt(*r.Step, 10)
	}
	if r.Loss != nil {
		loss = formatLoss(*r.Loss)
	}
	throughput := r.Throughput
	if throughput == "" {
		throughput = "-"
	}
	return []string{
		strconv.Itoa(r.Rank), r.Host, stateCell(r), pid, uptime,
		step, loss, throughput, r.LastLine,
	}
}

// stateCell is the state word, with the exit code or signal of a rank that
// did not exit cleanly: "failed (1)", "stopped (SIGTERM)".
func stateCell(r RankState) string {
	s := r.State.String()
	switch {
	case r.State == Running && r.Straggler != "":
		return s + " (slow)" // a word, not a colour: the table must read without one
	case !r.State.Ended() || r.State == Exited:
		return s
	case r.Signal != "":
		return fmt.Sprintf("%s (%s)", s, r.Signal)
	case r.Code != 0:
		return fmt.Sprintf("%s (%d)", s, r.Code)
	}
	return s
}

// summary counts ranks by state: "… 12 more ranks: 10 running, 2 pending".
func summary(ranks []RankState) string {
	var n [len(stateNames)]int
	for _, r := range ranks {
		n[r.State]++
	}
	var parts []string
	for s, c := range n {
		if c > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c, State(s)))
		}
	}
	return fmt.Sprintf("… %d more ranks: %s", len(ranks), strings.Join(parts, ", "))
}

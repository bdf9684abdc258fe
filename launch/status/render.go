package status

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/lipgloss/table"
)

// column is one column of the table: its header, whether it is numeric
// (right-aligned), and its cell for a rank.
type column struct {
	header string
	right  bool
	cell   func(r RankState, c *tableContext) string
}

// tableContext is what cells compare a rank with: the median step time of
// the ranks that report one, for the skew.
type tableContext struct {
	now        time.Time
	medianStep float64
}

// baseColumns are always shown; engineColumns only when some rank reports
// their figure (the built-in engine does; a torchrun command need not); the
// last line comes last and takes what width is left.
var (
	baseColumns = []column{
		{"RANK", true, func(r RankState, _ *tableContext) string { return strconv.Itoa(r.Rank) }},
		{"HOST", false, func(r RankState, _ *tableContext) string { return r.Host }},
		{"STATE", false, func(r RankState, _ *tableContext) string { return stateCell(r) }},
		{"PID", true, pidCell},
		{"UPTIME", true, uptimeCell},
		{"STEP", true, stepCell},
		{"LOSS", true, lossCell},
	}
	coordColumn    = column{"DP,PP,TP", true, coordCell}
	trendColumn    = column{"TREND", false, func(r RankState, _ *tableContext) string { return sparkline(r.Losses) }}
	throughputCol  = column{"THROUGHPUT", true, throughputCell}
	stepTimeColumn = column{"STEP TIME", true, stepTimeCell}
	memoryColumn   = column{"MEM", true, memoryCell}
	lastLineColumn = column{"LAST LINE", false, func(r RankState, _ *tableContext) string { return r.LastLine }}
)

// columns are the table's columns for ranks.
func columns(ranks []RankState) []column {
	cols := slices.Clone(baseColumns)
	some := func(has func(RankState) bool) bool { return slices.ContainsFunc(ranks, has) }
	if some(func(r RankState) bool { return r.Coord != nil }) {
		cols = append(cols, coordColumn)
	}
	if some(func(r RankState) bool { return len(r.Losses) > 1 }) {
		cols = append(cols, trendColumn)
	}
	cols = append(cols, throughputCol)
	if some(func(r RankState) bool { return r.StepMillis != nil }) {
		cols = append(cols, stepTimeColumn)
	}
	if some(func(r RankState) bool { return r.Memory != nil }) {
		cols = append(cols, memoryColumn)
	}
	return append(cols, lastLineColumn)
}

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
	cols := columns(ranks)
	lastCol := len(cols) - 1
	ctx := &tableContext{now: now, medianStep: medianStep(ranks)}
	rows := make([][]string, len(ranks))
	for i, r := range ranks {
		rows[i] = make([]string, len(cols))
		for j, c := range cols {
			rows[i][j] = c.cell(r, ctx)
		}
	}
	// Lay out once without the last line column's contents to learn how
	// much width it can have.
	full := make([]string, len(rows))
	for i, row := range rows {
		full[i], row[lastCol] = row[lastCol], ""
	}
	spare := lay.width - lipgloss.Width(buildTable(st, cols, ranks, rows).Render())
	room := lipgloss.Width(cols[lastCol].header) + spare
	for i, row := range rows {
		row[lastCol] = truncate(full[i], room)
	}
	out := buildTable(st, cols, ranks, rows).Render()
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

func buildTable(st *styles, cols []column, ranks []RankState, rows [][]string) *table.Table {
	headers := make([]string, len(cols))
	for i, c := range cols {
		headers[i] = c.header
	}
	lastCol := len(cols) - 1
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
			if cols[col].right {
				s = s.Align(lipgloss.Right)
			}
			return s
		})
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

// rowCells is r's row as a table of r alone shows it.
func rowCells(r RankState, now time.Time) []string {
	ranks := []RankState{r}
	ctx := &tableContext{now: now}
	var cells []string
	for _, c := range columns(ranks) {
		cells = append(cells, c.cell(r, ctx))
	}
	return cells
}

package main

import (
	"strings"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/lipgloss/table"
	"github.com/gtrain/gtrain/launch/status"
)

// tableCell is the base cell style of gtrain's result tables, bound to
// ios.Out (lipgloss drops colour when that is not a terminal), and whether
// colour is wanted at all (NO_COLOR unset). Callers derive their own
// highlight styles from it; meaning is never in colour alone.
func tableCell(ios *IOStreams) (cell lipgloss.Style, colour bool) {
	cell = lipgloss.NewRenderer(ios.Out).NewStyle().PaddingRight(2)
	return cell, ios.Getenv == nil || ios.Getenv("NO_COLOR") == ""
}

// renderTable renders rows under bold headers the way gtrain prints result
// tables (status.Borderless, columns padded by two spaces), trailing
// spaces trimmed from each line. style picks a data cell's style.
func renderTable(cell lipgloss.Style, headers []string, rows [][]string, style func(row, col int) lipgloss.Style) string {
	t := status.Borderless().
		Headers(headers...).
		Rows(rows...).
		StyleFunc(func(row, col int) lipgloss.Style {
			if row == table.HeaderRow {
				return cell.Bold(true)
			}
			return style(row, col)
		})
	var b strings.Builder
	for _, line := range strings.Split(t.Render(), "\n") {
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	return b.String()
}

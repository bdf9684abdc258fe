package status

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/charmbracelet/lipgloss"

	"github.com/gtrain/gtrain/launch/proto"
)

func attemptEv(n, world int) proto.Event {
	return proto.Event{V: 1, Type: proto.EventAttempt, Time: t0, Rank: -1, Node: -1, Attempt: n, World: world}
}

// startedOn is rank's rank_started as the agent of host (node) sends it.
func startedOn(rank, local, node int, host string, pid int) proto.Event {
	return proto.Event{V: 1, Type: proto.EventRankStarted, Time: t0, Host: host, Node: node, Rank: rank, Local: local, PID: pid}
}

// sixRanks is a job of two ranks on each of hosts a, b and c.
func sixRanks() []RankInfo {
	var out []RankInfo
	for r := range 6 {
		out = append(out, RankInfo{Rank: r, LocalRank: r % 2, Node: r / 2, Host: string(rune('a' + r/2))})
	}
	return out
}

// runAll starts every rank of m where the model places it and has each
// report a step, and rank 1 marked a straggler.
func runAll(m *Model) {
	for _, r := range m.Ranks() {
		m.Apply(startedOn(r.Rank, r.LocalRank, r.Node, r.Host, 100+r.Rank))
		m.Apply(statusEv(r.Rank, `{"step":7,"loss":2.5}`))
	}
	m.Apply(proto.Event{V: 1, Type: proto.EventStraggler, Rank: 1, Host: "a", Message: "slow"})
}

// summarize is each rank as "rank host state", for comparing.
func summarize(ranks []RankState) []string {
	var out []string
	for _, r := range ranks {
		s := fmt.Sprintf("%d %s %s", r.Rank, r.Host, r.State)
		if r.Step != nil || r.Straggler != "" || r.PID != 0 {
			s += fmt.Sprintf(" pid %d step %v straggler %q", r.PID, r.Step != nil, r.Straggler)
		}
		out = append(out, s)
	}
	return out
}

func sameRows(t *testing.T, what string, got, want []string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// TestAttemptSetsTheWorld: the model shows the ranks of the attempt that
// runs now. An elastic restart on fewer hosts shows the new world's ranks
// only, pending and without a host until they start (they may start
// elsewhere), nothing left of the attempt before (steps, straggler marks);
// a restart on more hosts adds ranks; the first attempt keeps the places
// the model was made with.
func TestAttemptSetsTheWorld(t *testing.T) {
	m := NewModel(sixRanks())
	m.Apply(attemptEv(0, 6))
	sameRows(t, "attempt 0, before any rank started", summarize(m.Ranks()),
		[]string{"0 a pending", "1 a pending", "2 b pending", "3 b pending", "4 c pending", "5 c pending"})
	runAll(m)
	if got := m.Ranks(); len(got) != 6 || got[5].State != Running || got[1].Straggler == "" {
		t.Fatalf("attempt 0 running: %q", summarize(got))
	}

	// Host b is lost: attempt 1 runs 4 ranks on a and c.
	m.Apply(exited(2, 143, "SIGTERM", true, 9))
	m.Apply(attemptEv(1, 4))
	sameRows(t, "attempt 1 (4 ranks), before they start", summarize(m.Ranks()),
		[]string{"0  pending", "1  pending", "2  pending", "3  pending"})
	m.Apply(startedOn(2, 0, 1, "c", 302))
	m.Apply(startedOn(3, 1, 1, "c", 303))
	m.Apply(proto.Event{V: 1, Type: proto.EventError, Time: t0, Host: "a", Node: 0, Rank: 0, Message: "exec: no such file"})
	got := m.Ranks()
	sameRows(t, "attempt 1, ranks 2 and 3 started on c, rank 0 failed to start on a", summarize(got),
		[]string{"0 a failed", "1  pending", "2 c running pid 302 step false straggler \"\"", "3 c running pid 303 step false straggler \"\""})
	if got[3].LocalRank != 1 || got[3].Node != 1 {
		t.Errorf("rank 3 of attempt 1: local rank %d, node %d; want 1 and 1, as its agent placed it", got[3].LocalRank, got[3].Node)
	}

	// A spare joins: attempt 2 runs 6 ranks again.
	m.Apply(attemptEv(2, 6))
	sameRows(t, "attempt 2 (6 ranks)", summarize(m.Ranks()),
		[]string{"0  pending", "1  pending", "2  pending", "3  pending", "4  pending", "5  pending"})
}

// TestAttemptFirstKeepsTheJob: the first attempt's event changes nothing
// the model was made with, but sizes it to the attempt's world.
func TestAttemptFirstKeepsTheJob(t *testing.T) {
	m := NewModel(sixRanks())
	runAll(m)
	before := summarize(m.Ranks())
	m.Apply(attemptEv(0, 6))
	sameRows(t, "attempt 0 after the ranks' events", summarize(m.Ranks()), before)
	m.Apply(attemptEv(0, 7))
	if got := m.Ranks(); len(got) != 7 || got[6].State != Pending || got[0].Host != "a" {
		t.Errorf("attempt 0 of 7 ranks: %q, want the six as they were and rank 6 pending", summarize(got))
	}
}

// TestAttemptOutOfBoundsIgnored: an attempt event without a world, or with
// more ranks than a job can have, leaves the model as it is.
func TestAttemptOutOfBoundsIgnored(t *testing.T) {
	for _, world := range []int{0, -1, maxWorld + 1} {
		m := NewModel(sixRanks())
		runAll(m)
		before := summarize(m.Ranks())
		m.Apply(attemptEv(1, world))
		sameRows(t, fmt.Sprintf("attempt of %d ranks", world), summarize(m.Ranks()), before)
	}
}

// TestTableAfterElasticRestart: the table of a restart on fewer ranks has
// a row for each rank of the new world and none for the ranks gone.
func TestTableAfterElasticRestart(t *testing.T) {
	m := NewModel(sixRanks())
	runAll(m)
	m.Apply(attemptEv(1, 4))
	m.Apply(startedOn(2, 0, 1, "c", 302))
	out := renderTable(newStyles(lipgloss.NewRenderer(&bytes.Buffer{})), m.Ranks(), t0, layout{width: 120})
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 5 || !strings.HasPrefix(strings.Join(strings.Fields(lines[3]), " "), "2 c running 302") {
		t.Errorf("table after a restart on 4 ranks, rank 2 started on c: want a header and 4 rows, rank 2's running on c; got\n%s", out)
	}
}

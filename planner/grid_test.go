package planner

import "testing"

func TestGridCoordRankRoundTrip(t *testing.T) {
	for _, g := range []Grid{{1, 1, 1}, {2, 1, 4}, {8, 4, 3}, {1, 3, 5}} {
		seen := map[Coord]bool{}
		for r := range g.World() {
			c := g.Coord(r)
			if c.TP >= g.TP || c.PP >= g.PP || c.DP >= g.DP || seen[c] {
				t.Fatalf("%+v: rank %d → %+v: out of range or repeated", g, r, c)
			}
			seen[c] = true
			if back := g.Rank(c); back != r {
				t.Errorf("%+v: Rank(Coord(%d)) = %d", g, r, back)
			}
		}
	}
}

// TestGridTPFastest pins the order: TP groups are consecutive ranks.
func TestGridTPFastest(t *testing.T) {
	g := Grid{TP: 2, PP: 2, DP: 2}
	want := []Coord{{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}, {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}}
	for r, w := range want {
		if got := g.Coord(r); got != w {
			t.Errorf("rank %d: got %+v, want %+v", r, got, w)
		}
	}
}

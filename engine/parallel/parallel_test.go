package parallel

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/comm/commtest"
	"github.com/gtrain/gtrain/planner"
)

// newWorld connects n in-process ranks. The timeout is a backstop only: a
// test that needs it has already failed.
func newWorld(t *testing.T, n int) []*comm.Communicator {
	t.Helper()
	trs := comm.NewInProc(n)
	commtest.CloseAtEnd(t, trs)
	return commtest.Open(t.Context(), t, n, func(ctx context.Context, r int) (*comm.Communicator, error) {
		return comm.New(ctx, r, n, trs[r], comm.Options{Name: "world", Timeout: 2 * time.Minute})
	})
}

// onAll runs f on every rank at once and fails the test on any error; the
// first error cancels the others' context, so a failing rank cannot leave
// its peers waiting for the timeout.
func onAll(t *testing.T, n int, f func(ctx context.Context, r int) error) {
	t.Helper()
	commtest.Check(t, runAll(t, n, true, f))
}

// runAll runs f on every rank at once and returns the errors by rank. With
// cancelOnErr, the first error cancels the other ranks' context.
func runAll(t *testing.T, n int, cancelOnErr bool, f func(ctx context.Context, r int) error) []error {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stop func()
	if cancelOnErr {
		stop = cancel
	}
	return commtest.Run(n, stop, func(r int) error { return f(ctx, r) })
}

// grids is every layout of at most 8 ranks.
func grids() []planner.Grid {
	var gs []planner.Grid
	for tp := 1; tp <= 8; tp++ {
		for pp := 1; tp*pp <= 8; pp++ {
			for dp := 1; tp*pp*dp <= 8; dp++ {
				gs = append(gs, planner.Grid{TP: tp, PP: pp, DP: dp})
			}
		}
	}
	return gs
}

// members are the world ranks, in group-rank order, that the grid puts in
// the group of c along one axis: the ranks whose coordinate differs from
// c's only there, ordered by that coordinate.
func members(g planner.Grid, c planner.Coord, axis string) []int {
	var out []int
	switch axis {
	case "tp":
		for i := range g.TP {
			out = append(out, g.Rank(planner.Coord{DP: c.DP, PP: c.PP, TP: i}))
		}
	case "pp":
		for i := range g.PP {
			out = append(out, g.Rank(planner.Coord{DP: c.DP, PP: i, TP: c.TP}))
		}
	case "dp":
		for i := range g.DP {
			out = append(out, g.Rank(planner.Coord{DP: i, PP: c.PP, TP: c.TP}))
		}
	case "embedding": // Megatron's: the first and last stage; the rank alone with one stage
		if c.PP != 0 && c.PP != g.PP-1 {
			return nil
		}
		out = append(out, g.Rank(planner.Coord{DP: c.DP, PP: 0, TP: c.TP}))
		if g.PP > 1 {
			out = append(out, g.Rank(planner.Coord{DP: c.DP, PP: g.PP - 1, TP: c.TP}))
		}
	}
	return out
}

// TestGroupsEveryGrid builds the groups of every layout of at most 8 ranks
// and checks, on every rank: each group's size, this rank's rank in it (the
// coordinate), the world rank of every member, and an all-reduce on each
// group at once whose result is exactly the sum over the ranks the grid
// puts in that group (computed from Grid.Rank, not from the groups).
func TestGroupsEveryGrid(t *testing.T) {
	all := grids()
	if len(all) != 38 { // the ordered triples with product ≤ 8
		t.Fatalf("%d grids, want 38", len(all))
	}
	for _, g := range all {
		t.Run(fmt.Sprintf("tp%d_pp%d_dp%d", g.TP, g.PP, g.DP), func(t *testing.T) {
			world := newWorld(t, g.World())
			groups := make([]*Groups, g.World())
			onAll(t, g.World(), func(ctx context.Context, r int) error {
				var err error
				groups[r], err = New(ctx, world[r], g)
				return err
			})
			t.Cleanup(func() {
				for _, gs := range groups {
					gs.Close()
				}
			})
			sums := allReduceRanks(t, groups)
			for r, gs := range groups {
				checkRank(t, g, r, gs, sums[r])
			}
		})
	}
}

// allReduceRanks all-reduces, on every group of every rank at once, the
// pair (world rank, 2^world rank): the sum, and the set of contributors.
func allReduceRanks(t *testing.T, groups []*Groups) []map[string][]float32 {
	sums := make([]map[string][]float32, len(groups))
	onAll(t, len(groups), func(ctx context.Context, r int) error {
		sums[r] = map[string][]float32{}
		var hs []*comm.Handle
		for name, c := range groups[r].byName() {
			if c == nil {
				continue
			}
			buf := []float32{float32(r), float32(int(1) << r)}
			sums[r][name] = buf
			hs = append(hs, c.AllReduceAsync(ctx, comm.F32(buf), comm.Sum))
		}
		for _, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	return sums
}

func (gs *Groups) byName() map[string]*comm.Communicator {
	return map[string]*comm.Communicator{"tp": gs.TP, "pp": gs.PP, "dp": gs.DP, "embedding": gs.Embed}
}

// checkRank compares rank r's groups with what the grid says.
func checkRank(t *testing.T, g planner.Grid, r int, gs *Groups, sums map[string][]float32) {
	t.Helper()
	c := g.Coord(r)
	if gs.Coord != c || gs.Grid != g {
		t.Errorf("rank %d: grid %+v coord %+v, want %+v %+v", r, gs.Grid, gs.Coord, g, c)
	}
	if gs.IsFirstStage() != (c.PP == 0) || gs.IsLastStage() != (c.PP == g.PP-1) {
		t.Errorf("rank %d (pp=%d of %d): first %v last %v", r, c.PP, g.PP, gs.IsFirstStage(), gs.IsLastStage())
	}
	wantRank := map[string]int{"tp": c.TP, "pp": c.PP, "dp": c.DP, "embedding": min(c.PP, 1)}
	for name, sub := range gs.byName() {
		want := members(g, c, name)
		if want == nil {
			if sub != nil {
				t.Errorf("rank %d (pp=%d of %d): in an embedding group of size %d, want none", r, c.PP, g.PP, sub.Size())
			}
			continue
		}
		if sub == nil {
			t.Errorf("rank %d: no %s group, want one of %v", r, name, want)
			continue
		}
		var got []int
		for i := range sub.Size() {
			got = append(got, sub.WorldRank(i))
		}
		if !slices.Equal(got, want) || sub.Rank() != wantRank[name] {
			t.Errorf("rank %d: %s group %v with rank %d, want %v with rank %d", r, name, got, sub.Rank(), want, wantRank[name])
		}
		if sub.Name() != name { // errors and flight records name the group by its kind
			t.Errorf("rank %d: the %s group is named %q", r, name, sub.Name())
		}
		var sum, set int
		for _, m := range want {
			sum, set = sum+m, set|1<<m
		}
		if s := sums[name]; s[0] != float32(sum) || s[1] != float32(set) {
			t.Errorf("rank %d: %s all-reduce gave sum %v set %b, want %d %b", r, name, s[0], int(s[1]), sum, set)
		}
	}
	if g.PP >= 2 && (c.PP == 0 || c.PP == g.PP-1) && (gs.Embed == nil || gs.Embed.Size() != 2) {
		t.Errorf("rank %d: embedding group %v, want the first and last stage", r, gs.Embed)
	}
}

// TestNewRefuses checks that a layout that does not fit the world fails on
// every rank alike, naming the problem, and leaves the world usable.
func TestNewRefuses(t *testing.T) {
	const n = 4
	for _, tc := range []struct {
		name string
		grid func(r int) planner.Grid
		want []string
	}{
		{"fewer ranks", func(int) planner.Grid { return planner.Grid{TP: 2, PP: 1, DP: 1} },
			[]string{"tp=2 pp=1 dp=1 needs 2 ranks", "the world has 4"}},
		{"more ranks", func(int) planner.Grid { return planner.Grid{TP: 2, PP: 2, DP: 2} },
			[]string{"needs 8 ranks", "the world has 4"}},
		{"degree zero", func(int) planner.Grid { return planner.Grid{TP: 0, PP: 2, DP: 2} },
			[]string{"every degree must be at least 1"}},
		{"negative degrees", func(int) planner.Grid { return planner.Grid{TP: -2, PP: -2, DP: 1} },
			[]string{"every degree must be at least 1"}},
		{"ranks disagree", func(r int) planner.Grid {
			if r == 3 {
				return planner.Grid{TP: 4, PP: 1, DP: 1}
			}
			return planner.Grid{TP: 2, PP: 2, DP: 1}
		}, []string{"different layouts (tp from 2 to 4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			world := newWorld(t, n)
			errs := runAll(t, n, false, func(ctx context.Context, r int) error {
				gs, err := New(ctx, world[r], tc.grid(r))
				if err == nil {
					gs.Close()
				}
				return err
			})
			for r, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: New succeeded", r)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) || !strings.HasPrefix(err.Error(), "parallel: new: ") {
						t.Errorf("rank %d: %v, want it to contain %q", r, err, w)
					}
				}
			}
			onAll(t, n, func(ctx context.Context, r int) error { return world[r].Barrier(ctx) })
		})
	}
}

func TestNewNilWorld(t *testing.T) {
	if _, err := New(t.Context(), nil, planner.Grid{TP: 1, PP: 1, DP: 1}); err == nil || !strings.Contains(err.Error(), "no world communicator") {
		t.Fatalf("New(nil world): %v", err)
	}
}

// TestCloseTwice: Close after Close is harmless, and the world survives.
func TestCloseTwice(t *testing.T) {
	g := planner.Grid{TP: 1, PP: 2, DP: 1}
	world := newWorld(t, 2)
	onAll(t, 2, func(ctx context.Context, r int) error {
		gs, err := New(ctx, world[r], g)
		if err != nil {
			return err
		}
		if err := gs.Close(); err != nil {
			return err
		}
		if err := gs.Close(); err != nil {
			return err
		}
		return world[r].Barrier(ctx)
	})
}

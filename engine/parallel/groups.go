package parallel

import (
	"context"
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/planner"
)

// split makes the four groups, in the same order on every rank (each Split
// is a collective over the world). A group's color is the world rank of its
// rank 0; its key is the coordinate along the group's axis, which makes the
// group rank equal to the coordinate. Each group is named after its kind
// (tp, pp, dp, embedding), so that errors and flight records say which
// group a call belongs to: by color alone a TP and a PP group starting at
// the same rank read alike (their world ranks tell groups of a kind apart).
func (gs *Groups) split(ctx context.Context) error {
	c, g := gs.Coord, gs.Grid
	for _, s := range []struct {
		name      string
		dst       **comm.Communicator
		first     planner.Coord // the coordinate of the group's rank 0
		key       int
		inNoGroup bool
	}{
		{"tp", &gs.TP, planner.Coord{DP: c.DP, PP: c.PP}, c.TP, false},
		{"pp", &gs.PP, planner.Coord{DP: c.DP, TP: c.TP}, c.PP, false},
		{"dp", &gs.DP, planner.Coord{PP: c.PP, TP: c.TP}, c.DP, false},
		// Key 0 on the first stage, 1 on the last; a middle stage is in none.
		{"embedding", &gs.Embed, planner.Coord{DP: c.DP, TP: c.TP}, min(c.PP, 1), !gs.IsFirstStage() && !gs.IsLastStage()},
	} {
		color := g.Rank(s.first)
		if s.inNoGroup {
			color = -1 // Split's "no group": this rank still takes part in the exchange
		}
		sub, err := gs.World.SplitNamed(ctx, s.name, color, s.key)
		if err != nil {
			return fmt.Errorf("parallel: new: split the %s group of rank %d (dp=%d pp=%d tp=%d): %w",
				s.name, gs.World.Rank(), c.DP, c.PP, c.TP, err)
		}
		*s.dst = sub
	}
	return nil
}

// IsFirstStage reports whether this rank holds the first pipeline stage
// (the token and position embeddings).
func (gs *Groups) IsFirstStage() bool { return gs.Coord.PP == 0 }

// IsLastStage reports whether this rank holds the last pipeline stage (the
// final LayerNorm, the output layer and the loss). With one stage it is
// also the first.
func (gs *Groups) IsLastStage() bool { return gs.Coord.PP == gs.Grid.PP-1 }

// Close closes the groups' communicators (not the world). Closing twice is
// harmless.
func (gs *Groups) Close() error {
	var errs []error
	for _, c := range []*comm.Communicator{gs.TP, gs.PP, gs.DP, gs.Embed} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// Package parallel builds a rank's process groups for 3D parallelism
// (tensor, pipeline and data parallel, as in Megatron-LM) from the one rank
// layout the planner prints: planner.Grid.Coord, TP varying fastest, then
// PP, then DP. New splits the world communicator into
//
//   - TP: the ranks with this rank's (dp, pp), in tp order;
//   - PP: the ranks with this rank's (dp, tp), in pp order (the pipeline's
//     point-to-point sends go to PP rank pp±1);
//   - DP: the ranks with this rank's (pp, tp), in dp order (the replicas of
//     this rank's shard of the model, for gradient reductions and ZeRO);
//   - Embed: the first and the last pipeline stage of this rank's (dp, tp),
//     which hold the two copies of the tied token embedding and all-reduce
//     its gradient. As in Megatron-LM, with pp == 1 it is the rank alone, and
//     a middle stage is in no embedding group (Embed is nil).
//
// In every group a rank's rank is its coordinate (TP.Rank() == Coord.TP,
// and so on), so code indexes shards and stages by coordinate and never
// needs a second mapping. Nothing here knows a transport: the groups are
// comm.Split's, which opens each group's own links, so the groups can run
// concurrently with each other and with the world.
package parallel

import (
	"context"
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/planner"
)

// Groups are one rank's communicators for a 3D-parallel layout. They are
// built by New and released by Close; the world communicator stays the
// caller's.
type Groups struct {
	// Grid is the layout, the same on every rank.
	Grid planner.Grid
	// Coord is this rank's place in Grid: Grid.Coord(World.Rank()).
	Coord planner.Coord
	// World is the communicator the groups were split from (not owned).
	World *comm.Communicator
	// TP, PP and DP are the tensor-, pipeline- and data-parallel groups;
	// this rank's rank in each is Coord.TP, Coord.PP and Coord.DP.
	TP, PP, DP *comm.Communicator
	// Embed ties the first and last pipeline stage of this rank's (dp, tp):
	// rank 0 is the first stage, rank 1 the last. With Grid.PP == 1 it is
	// this rank alone; on a middle stage it is nil.
	Embed *comm.Communicator
}

// New builds this rank's groups of layout g over world. It is a collective
// over world: every rank calls it with the same g, at the same point in its
// sequence of world operations. It fails on every rank alike when the ranks
// were given different layouts, when a degree is below 1, or when
// g.World() is not world.Size(); the world stays usable after those errors.
func New(ctx context.Context, world *comm.Communicator, g planner.Grid) (*Groups, error) {
	if world == nil {
		return nil, errors.New("parallel: new: no world communicator (a rank alone still needs one of size 1)")
	}
	// Agree first, before any check that could make one rank return early
	// and leave the others waiting in a collective.
	if err := agree(ctx, world, g); err != nil {
		return nil, err
	}
	if err := check(world, g); err != nil {
		return nil, err
	}
	gs := &Groups{Grid: g, Coord: g.Coord(world.Rank()), World: world}
	if err := gs.split(ctx); err != nil {
		gs.Close()
		return nil, err
	}
	return gs, nil
}

// check reports a layout that does not fit the world.
func check(world *comm.Communicator, g planner.Grid) error {
	if err := g.Validate(); err != nil {
		return fmt.Errorf("parallel: new: %w", err)
	}
	if g.World() != world.Size() {
		return fmt.Errorf("parallel: new: layout tp=%d pp=%d dp=%d needs %d ranks, but the world has %d: choose degrees whose product tp × pp × dp is %d",
			g.TP, g.PP, g.DP, g.World(), world.Size(), world.Size())
	}
	return nil
}

// agree checks that every rank was given the same layout: otherwise the
// splits would form groups that do not match, which shows only as a hang
// until the communicator's timeout. One small all-reduce of the degrees and
// their negations gives each degree's maximum and minimum over the ranks.
func agree(ctx context.Context, world *comm.Communicator, g planner.Grid) error {
	degs := []int{g.TP, g.PP, g.DP}
	buf := make([]float32, 2*len(degs))
	for i, d := range degs {
		// Clamped so the float32 is exact; a degree this large fails check.
		d = min(max(d, -1<<24), 1<<24)
		buf[i], buf[len(degs)+i] = float32(d), -float32(d)
	}
	if err := world.AllReduce(ctx, comm.F32(buf), comm.Max); err != nil {
		return fmt.Errorf("parallel: new: compare layouts: %w", err)
	}
	for i, name := range []string{"tp", "pp", "dp"} {
		if hi, lo := buf[i], -buf[len(degs)+i]; hi != lo {
			return fmt.Errorf("parallel: new: the ranks were given different layouts (%s from %v to %v; this rank has tp=%d pp=%d dp=%d): every rank must get the same parallel degrees",
				name, lo, hi, g.TP, g.PP, g.DP)
		}
	}
	return nil
}

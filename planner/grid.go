package planner

import "fmt"

// Grid is the degrees of a 3D-parallel layout: tensor (TP), pipeline (PP)
// and data (DP) parallel. The world is TP × PP × DP ranks.
type Grid struct {
	TP int `json:"tp"`
	PP int `json:"pp"`
	DP int `json:"dp"`
}

// Coord is one rank's place in a Grid.
type Coord struct {
	DP int `json:"dp"`
	PP int `json:"pp"`
	TP int `json:"tp"`
}

// World is the number of ranks, TP × PP × DP.
func (g Grid) World() int { return g.TP * g.PP * g.DP }

// Validate reports a degree below 1.
func (g Grid) Validate() error {
	if g.TP < 1 || g.PP < 1 || g.DP < 1 {
		return fmt.Errorf("planner: layout tp=%d pp=%d dp=%d: every degree must be at least 1", g.TP, g.PP, g.DP)
	}
	return nil
}

// Coord is the one rank-layout function the planner prints and the engine
// uses: global rank → (dp, pp, tp), TP varying fastest, then PP, then DP, so
// that a TP group is TP consecutive ranks and sits inside one node when TP
// divides the GPUs per node (ranks are numbered host by host, slot by slot).
func (g Grid) Coord(rank int) Coord {
	return Coord{TP: rank % g.TP, PP: rank / g.TP % g.PP, DP: rank / (g.TP * g.PP)}
}

// Coords is Coord of every rank, in rank order.
func (g Grid) Coords() []Coord {
	cs := make([]Coord, g.World())
	for r := range cs {
		cs[r] = g.Coord(r)
	}
	return cs
}

// Rank is the inverse of Coord.
func (g Grid) Rank(c Coord) int {
	return c.TP + g.TP*(c.PP+g.PP*c.DP)
}

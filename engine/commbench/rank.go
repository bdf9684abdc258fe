package commbench

import (
	"context"
	"io"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/dist"
)

// RunRank is one rank of `gtrain bench collectives` started by a launcher:
// it joins the job's other ranks through the job's store (engine/dist,
// from the rank's environment as getenv reads it), measures rc on every
// rank, and returns the report on rank 0 (nil on the others). When table
// is not nil, rank 0 also writes the text report there, a line per
// result as it comes.
func RunRank(ctx context.Context, getenv func(string) string, rc RankConfig, table io.Writer) (*Report, error) {
	env, err := dist.FromEnv(getenv)
	if err != nil {
		return nil, err
	}
	w, err := dist.Init(ctx, env, dist.Options{Comm: comm.Options{Algorithm: rc.Algorithm, Timeout: rc.Timeout}})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	rep := Report{WorldSize: env.WorldSize, Hosts: w.Hosts(), Algorithm: rc.Algorithm}
	var tab *Table
	if table != nil && env.Rank == 0 {
		tab = NewTable(table)
		tab.Preamble(rep, rc.Config)
	}
	err = Run(ctx, w.Comm, rc.Config, func(r Result) {
		rep.Results = append(rep.Results, r)
		if tab != nil {
			tab.Row(r)
		}
	})
	switch {
	case err != nil:
		return nil, err
	case env.Rank != 0:
		return nil, nil
	case tab != nil && tab.Err() != nil:
		return nil, tab.Err()
	}
	return &rep, nil
}

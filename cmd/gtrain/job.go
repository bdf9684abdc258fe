package main

import (
	"context"
	"time"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/jobfile"
)

// loadJob is jobfile.Load, for gtrain worker started alone (worker.go).
func loadJob(ctx context.Context, path string, sets []string) (train.Spec, error) {
	return jobfile.Load(ctx, path, sets)
}

// engineJob is train.ResolveIn with a new run directory made at now, for
// gtrain worker started alone (worker.go).
func engineJob(spec train.Spec, dir string, now time.Time) (train.Spec, string, error) {
	return train.ResolveIn(spec, dir, func(runs string) (string, error) { return train.FreshRunDir(runs, now) })
}

// oneLine is jobfile.OneLine, for the config file's errors (config.go).
func oneLine(err error) string { return jobfile.OneLine(err) }

package main

import "github.com/gtrain/gtrain/engine/train"

// checkEngineMemory refuses a local job of the built-in engine whose ranks
// cannot fit in this machine's memory, before any rank starts
// (train.CheckMemory; a *train.MemoryError is a usage error). The ranks of
// a hostfile job check on their own hosts; a dry run starts nothing.
func (o *RunOptions) checkEngineMemory(spec train.Spec) error {
	if o.Hostfile != "" || o.DryRun {
		return nil
	}
	return train.CheckMemory(spec, o.NprocPerNode)
}

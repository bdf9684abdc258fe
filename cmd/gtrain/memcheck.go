package main

import "github.com/gtrain/gtrain/engine/train"

// checkEngineMemory refuses a local job of the built-in engine whose ranks
// cannot fit in this machine's memory, before any rank starts
// (train.CheckMemory; a *train.MemoryError is a usage error). The ranks of
// a hostfile job check on their own hosts. A dry run checks too: it shows
// what the run would do, and the run would refuse.
func (o *RunOptions) checkEngineMemory(spec train.Spec) error {
	if o.Hostfile != "" {
		return nil
	}
	return train.CheckMemory(spec, o.NprocPerNode)
}

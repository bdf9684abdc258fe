//go:build linux && race

package comm

import "sync/atomic"

// shmRaceSync makes the race detector see the ordering a shared-memory
// link provides, which it cannot see through the mapping: a Send
// happens before the Recv of its message. Like the syscall package's
// ioSync for pipes and sockets, it is one word for the whole process, so
// it also orders calls across links (a message's reply, sent on another
// link, follows it); it exists only in -race builds.
var shmRaceSync atomic.Uint64

func shmRaceRelease() { shmRaceSync.Add(1) }

func shmRaceAcquire() { shmRaceSync.Load() }

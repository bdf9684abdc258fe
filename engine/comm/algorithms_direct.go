package comm

// The direct algorithms, for groups whose ranks all share one host: every
// rank works with every other at once instead of passing blocks around a
// ring, through the shared-memory rings, all driven from one goroutine so
// that nothing waits on one link while another could move, and nothing is
// handed between goroutines (shm_progress.go). Reduce-scatter: rank r
// streams block j of its input to rank j and reduces block r chunk by chunk
// straight out of the rings as every peer's part arrives. All-gather: rank r
// streams its block to every peer and copies theirs in as they come. An
// all-reduce is the two, each reduced chunk going out as soon as it is
// done. Per rank a byte is copied once into a ring and read once out of it.
//
// Reading the peers' buffers directly (process_vm_readv, one copy instead
// of two) was built and measured too: it lost at every size, by about 2x
// from 256 KiB to 64 MiB, since the system call pins pages and copies at
// about 16 GB/s where an in-cache copy runs at 80 GB/s.

// isLocal reports whether a link reaches a rank on this host.
func isLocal(cn Conn) bool {
	_, ok := cn.(*shmConn)
	return ok
}

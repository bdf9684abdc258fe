// Package comm is gtrain's collective communication library: the
// Communicator the ranks of the built-in engine use for all-reduce,
// reduce-scatter, all-gather and the rest, over pluggable transports (TCP
// between hosts, shared memory within one).
package comm

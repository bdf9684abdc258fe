// Package rendezvous is where the nodes of a gtrain job meet: a server the
// launcher runs, and a client each node agent (and later each rank of the
// built-in engine) uses.
//
// The server holds one membership round and one small key-value store for
// one job. Every connection first passes a mutual HMAC-SHA256
// challenge–response over a per-job secret (NewSecret) that only the
// launcher and its agents know; the secret itself never crosses the wire.
//
// The round: the server knows the expected node names in hostfile order.
// Each agent joins with its name and host facts; when all have joined, every
// agent learns all members, and its own node rank, which is the index of its
// name in that order, whatever the order of joining. Server.WaitRound names
// the nodes still missing when its context ends.
//
// The store: Set, Get (which waits for the key), Add (an atomic counter),
// CompareAndSet and Barrier, on opaque byte values with size limits.
//
// The wire protocol (JSON lines over TCP, version 1) is described in
// PROTOCOL.md next to this file.
package rendezvous

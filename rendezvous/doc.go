// Package rendezvous is where the nodes of a gtrain job meet: a server the
// launcher runs, and a client each node agent and each rank of the
// built-in engine uses; or an etcd cluster that all of them use.
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
//
// The same round, store and liveness can live in an etcd cluster instead
// (EtcdClient, torchrun's --rdzv-backend etcd): everything under
// /gtrain/RUN/ATTEMPT, each value signed with the job's secret over its
// key, each joined node holding a lease. Backend is what both give a node
// or rank, and Open picks one from an endpoint. PROTOCOL.md describes the
// etcd key layout too.
package rendezvous

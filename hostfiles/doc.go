// Package hostfiles parses hostfiles and selects the hosts and slots a job
// runs on.
//
// # Hostfile format
//
// A hostfile lists one host per line. Everything from "#" to the end of a
// line is a comment. Blank lines, and whitespace at either end of a line, are
// ignored. Fields are separated by spaces or tabs. CRLF line endings and a
// leading UTF-8 byte-order mark are accepted.
//
// The long form, shared with DeepSpeed and Open MPI, is
//
//	[user@]host[:port] slots=N [max_slots=M]
//
// slots=N is the number of slots (usually GPUs) on the host, from 1 to 1024.
// max_slots=M is optional and must be at least N; the Open MPI spelling
// max-slots=M is accepted too. Each key may appear once per line; any other
// key is an error. With slots= on the line, "host:X" means X is the SSH port
// (1 to 65535).
//
// The short form is
//
//	[user@]host:N
//
// with no other field on the line: here N is the slot count, not a port. To
// give a port, use the long form: "worker-0:2222 slots=8". A host with no slot
// count at all ("worker-0" alone) is refused rather than given a default.
//
// host is a host name or IPv4 address of at most 253 ASCII letters, digits, ".", "-"
// and "_", not starting with "-" or "."; it is also the name used by
// [Filter.Include] and [Filter.Exclude]. user, if given, uses the same
// characters. An IPv6 address goes in brackets, optionally followed by a port
// or, in the short form, a slot count:
//
//	[::1]:2222 slots=2
//	[fe80::1%eth0] slots=2
//	[::1]:4
//
// An unbracketed name with two or more colons is taken as an IPv6 address
// with no port, so "::1 slots=2" works too; the brackets are dropped from
// [Host.Name].
//
// Each host may appear only once. Names are compared without regard to case,
// and IPv6 addresses by value, so "Worker-0" duplicates "worker-0" and "::1"
// duplicates "0::1"; the user and port do not make two lines different hosts.
// A file with no hosts is an error. Parse errors are [*ParseError] values
// naming the file and line.
//
// # Selecting hosts and slots
//
// [Select] applies a [Filter] in the DeepSpeed launcher's syntax: entries
// separated by "@", each a host with an optional ":" and comma-separated slot
// indices, as in "worker-0:0,2@worker-1". A host without slots means all its
// slots. Select an IPv6 host's slots with brackets: "[::1]:0,1". Include keeps
// only what is listed; Exclude removes it, and a host left with no slots is
// dropped. NumNodes and NumSlots keep the first N hosts and the first N slots
// of each host. Include and Exclude cannot be combined with each other or with
// the limits. Every name and slot must exist: nothing is dropped silently.
//
// # Slurm
//
// [ExpandHostlist] expands a Slurm hostlist as `scontrol show hostnames`
// does ("node[01-04,07],gpu-[1-2]"), strictly and bounded; [SlurmHosts]
// reads the hosts of the allocation gtrain runs in from SLURM_JOB_NODELIST
// and its slots from SLURM_GPUS_ON_NODE or SLURM_TASKS_PER_NODE
// ([ExpandTasksPerNode]); [ListHosts] is gtrain run --hosts. Their hosts
// go through [Select] like a hostfile's.
package hostfiles

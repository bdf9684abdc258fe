// Package rankenv names the environment variables through which a rank
// learns its place in a job: torchrun's contract (RANK, WORLD_SIZE,
// MASTER_ADDR, TORCHELASTIC_*), which gtrain gives every rank so that a
// PyTorch program runs under gtrain as under torchrun, and gtrain's own
// GTRAIN_* variables, which its agent and its built-in engine add.
//
// The launcher writes these variables (launch) and the engine's ranks read
// them (engine/dist, engine/train): one name in one place, so that the two
// sides cannot drift apart. It holds names only and imports nothing, so
// that both sides may depend on it.
package rankenv

// torchrun's contract: what torch.distributed.run gives every rank
// (https://pytorch.org/docs/stable/elastic/run.html#environment-variables).
const (
	Rank           = "RANK"             // global rank, 0 ≤ RANK < WORLD_SIZE
	LocalRank      = "LOCAL_RANK"       // rank among this host's ranks
	WorldSize      = "WORLD_SIZE"       // ranks in the job
	LocalWorldSize = "LOCAL_WORLD_SIZE" // ranks on this host
	GroupRank      = "GROUP_RANK"       // this host's index (node rank)
	GroupWorldSize = "GROUP_WORLD_SIZE" // hosts in the job
	RoleRank       = "ROLE_RANK"        // rank among the ranks of its role (gtrain: one role, so RANK)
	RoleName       = "ROLE_NAME"        // the role ("default")
	RoleWorldSize  = "ROLE_WORLD_SIZE"  // ranks of the role (gtrain: WORLD_SIZE)
	MasterAddr     = "MASTER_ADDR"      // where rank 0 serves torch's store
	MasterPort     = "MASTER_PORT"

	RestartCount  = "TORCHELASTIC_RESTART_COUNT"   // restarts of the job so far: 0 on its first attempt
	MaxRestarts   = "TORCHELASTIC_MAX_RESTARTS"    // --max-restarts
	RunID         = "TORCHELASTIC_RUN_ID"          // the job's id (--rdzv-id)
	UseAgentStore = "TORCHELASTIC_USE_AGENT_STORE" // "False": the ranks start their own store
	// ErrorFile is where a failing rank records its error, as torch's
	// @record decorator does, for the launcher's failure report.
	ErrorFile = "TORCHELASTIC_ERROR_FILE"
	// SignalsToHandle is the signals torchrun's agent handles (its
	// --signals-to-handle), which torchrun (2.11, seen) passes on to every
	// rank.
	SignalsToHandle = "TORCHELASTIC_SIGNALS_TO_HANDLE"
	// AsyncErrorHandling turns on the NCCL watchdog's handling of a failed
	// or stuck collective (PyTorch 2.2 and later; before, and still read
	// with a deprecation warning, AsyncErrorHandlingOld).
	AsyncErrorHandling    = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
	AsyncErrorHandlingOld = "NCCL_ASYNC_ERROR_HANDLING"
)

// DefaultSignalsToHandle is torchrun's default --signals-to-handle.
const DefaultSignalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

// gtrain's own variables, which torchrun does not set.
const (
	GtrainRunID = "GTRAIN_RUN_ID"  // the job's id, as TORCHELASTIC_RUN_ID
	Host        = "GTRAIN_HOST"    // the hostfile's name of this rank's host
	Slot        = "GTRAIN_SLOT"    // the device slot of this rank (CUDA_VISIBLE_DEVICES index)
	Attempt     = "GTRAIN_ATTEMPT" // as TORCHELASTIC_RESTART_COUNT
	// StatusFD is the number of the file descriptor on which a rank may
	// write JSON status records for the agent's live table.
	StatusFD = "GTRAIN_STATUS_FD"
	// StoreAddr and StoreSecretFile tell a rank where the job's rendezvous
	// store is and where to read its secret (a 0600 file, never the
	// environment itself).
	StoreAddr       = "GTRAIN_STORE_ADDR"
	StoreSecretFile = "GTRAIN_STORE_SECRET_FILE"
	// JobSpec carries the resolved job spec (JSON) of the built-in engine
	// from the launcher to every rank. It is not a secret, and an
	// environment variable travels to remote hosts inside the agent's spec.
	JobSpec = "GTRAIN_JOB_SPEC"
	// CPUs is the CPUs a bound rank may keep busy (gtrain run --bind): its
	// own cores, or its share of a NUMA node's. The built-in engine runs
	// that many compute threads.
	CPUs = "GTRAIN_CPUS"
	// DumpDir is where a built-in engine rank writes rank-R.hang.json (its
	// flight record, internal/flightrec) and rank-R.stacks.txt when it gets
	// the dump signal (SIGUSR2) or a collective of it fails: the attempt's
	// log directory, set by the launcher with --log-dir.
	DumpDir = "GTRAIN_DUMP_DIR"
)

// Variables a user may set for the built-in engine's ranks (with --env or in
// the launcher's environment, which forwards GTRAIN_*).
const (
	// CommAddr is the address peers dial for this rank's TCP links
	// (default: the address this host reached the store from).
	CommAddr = "GTRAIN_COMM_ADDR"
	// NoSHM "1" makes ranks of one host talk over TCP, not shared memory.
	NoSHM = "GTRAIN_COMM_NO_SHM"
	// CommSpinUS is how many microseconds the ring over TCP polls its
	// sockets without sleeping before it sleeps in poll(2) (0: at once;
	// unset: comm.DefaultTCPSpinWait).
	CommSpinUS = "GTRAIN_COMM_SPIN_US"
	// CommTCPCC is the TCP congestion control of the ranks' TCP links
	// (unset: comm.DefaultTCPCongestion; "system": the host's own).
	CommTCPCC = "GTRAIN_COMM_TCP_CC"
	// CommTCPBuf is SO_SNDBUF and SO_RCVBUF of the ranks' TCP links, in
	// bytes, as Open MPI's btl_tcp_sndbuf and btl_tcp_rcvbuf (unset or 0:
	// the kernel's autotuning, the default).
	CommTCPBuf = "GTRAIN_COMM_TCP_BUF"
	// FaultFailAfterStep makes the first attempt of a job fail after the
	// given step, once its checkpoints up to there are written: a fault
	// injection that lets the tests of --max-restarts fail a real rank at a
	// known point.
	FaultFailAfterStep = "GTRAIN_FAULT_FAIL_AFTER_STEP"
)

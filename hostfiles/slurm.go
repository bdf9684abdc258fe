package hostfiles

import (
	"context"
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/internal/usage"
)

// The variables Slurm sets inside an allocation (sbatch, salloc, srun) that
// gtrain reads.
const (
	SlurmJobID        = "SLURM_JOB_ID"
	SlurmJobNodelist  = "SLURM_JOB_NODELIST"
	SlurmNodelist     = "SLURM_NODELIST" // the older name, still set
	SlurmNNodes       = "SLURM_NNODES"
	SlurmGPUsOnNode   = "SLURM_GPUS_ON_NODE"
	SlurmTasksPerNode = "SLURM_TASKS_PER_NODE"
	SlurmNTasksPer    = "SLURM_NTASKS_PER_NODE"
)

// InSlurm reports whether getenv describes a Slurm allocation: a job id
// and its node list.
func InSlurm(getenv func(string) string) bool {
	return getenv(SlurmJobID) != "" && slurmNodelist(getenv) != ""
}

func slurmNodelist(getenv func(string) string) string {
	if s := getenv(SlurmJobNodelist); s != "" {
		return s
	}
	return getenv(SlurmNodelist)
}

// ErrNotInSlurm is SlurmHosts's error outside an allocation.
var ErrNotInSlurm = errors.New("hostfiles: not inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are unset): run gtrain from an sbatch script or salloc, or name the hosts with --hostfile or --hosts")

// SlurmHosts returns the hosts of the Slurm allocation getenv describes,
// in the node list's order (node rank 0 is its first node), each with its
// slots (ranks) counted the way torchrun and DeepSpeed users under Slurm
// expect:
//
//  1. nproc, when the user gave --nproc-per-node (nproc > 0): on every node;
//  2. SLURM_GPUS_ON_NODE (sbatch --gpus-per-node, --gres=gpu:N): one rank per
//     GPU, on every node (Slurm gives only this node's count; an allocation
//     for training is homogeneous);
//  3. SLURM_TASKS_PER_NODE (--ntasks-per-node, --ntasks), per node, as
//     mpirun under Slurm reads it; then SLURM_NTASKS_PER_NODE;
//  4. else 1.
//
// Outside an allocation it returns ErrNotInSlurm. The node list is
// expanded by ExpandHostlist; a node named twice, a count for another
// number of nodes than SLURM_NNODES or the list holds, or a count over
// MaxSlotsPerHost is an error naming the variable.
func SlurmHosts(getenv func(string) string, nproc int) ([]Host, error) {
	if !InSlurm(getenv) {
		return nil, ErrNotInSlurm
	}
	names, err := ExpandHostlist(slurmNodelist(getenv))
	if err != nil {
		return nil, err
	}
	if err := checkNNodes(getenv(SlurmNNodes), len(names)); err != nil {
		return nil, err
	}
	slots, err := slurmSlots(getenv, nproc, len(names))
	if err != nil {
		return nil, err
	}
	return namedHosts(names, slots, "SLURM_JOB_NODELIST")
}

// checkNNodes compares SLURM_NNODES, when set, with the node list.
func checkNNodes(s string, n int) error {
	if s == "" {
		return nil
	}
	if v, err := parseDigits(s); err != nil || v != n {
		return fmt.Errorf("hostfiles: %s=%q but the node list has %d nodes: is the environment from another job?", SlurmNNodes, s, n)
	}
	return nil
}

// slurmSlots is the slot count of each of n nodes (see SlurmHosts).
func slurmSlots(getenv func(string) string, nproc, n int) ([]int, error) {
	same := func(v int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	if nproc > 0 {
		return same(nproc), nil
	}
	if s := getenv(SlurmGPUsOnNode); s != "" && s != "0" {
		v, err := parseCount(SlurmGPUsOnNode, s)
		if err != nil {
			return nil, fmt.Errorf("hostfiles: %w", err)
		}
		return same(v), nil
	}
	if s := getenv(SlurmTasksPerNode); s != "" {
		return ExpandTasksPerNode(SlurmTasksPerNode, s, n)
	}
	if s := getenv(SlurmNTasksPer); s != "" {
		v, err := parseCount(SlurmNTasksPer, s)
		if err != nil {
			return nil, fmt.Errorf("hostfiles: %w", err)
		}
		return same(v), nil
	}
	return same(1), nil
}

// ListHosts returns the hosts of a hostlist given on the command line
// (gtrain run --hosts 'node[01-04]'), each with slots slots; what names
// the flag in errors. A host named twice is an error, as in a hostfile.
func ListHosts(list string, slots int, what string) ([]Host, error) {
	if slots < 1 || slots > MaxSlotsPerHost {
		return nil, fmt.Errorf("hostfiles: %s: %d ranks per host: want 1 to %d", what, slots, MaxSlotsPerHost)
	}
	names, err := ExpandHostlist(list)
	if err != nil {
		return nil, err
	}
	counts := make([]int, len(names))
	for i := range counts {
		counts[i] = slots
	}
	return namedHosts(names, counts, what)
}

// namedHosts pairs names with slot counts, refusing duplicates and more
// slots than MaxFileSlots in all.
func namedHosts(names []string, slots []int, what string) ([]Host, error) {
	hosts := make([]Host, len(names))
	seen := make(map[string]int, len(names))
	total := 0
	for i, name := range names {
		if j, dup := seen[hostKey(name)]; dup {
			return nil, fmt.Errorf("hostfiles: %s: host %q is listed twice (as hosts %d and %d): name each host once", what, name, j+1, i+1)
		}
		seen[hostKey(name)] = i
		total += slots[i]
		if err := checkSize(i+1, total); err != nil {
			return nil, fmt.Errorf("hostfiles: %s: %w", what, err)
		}
		hosts[i] = Host{Name: name, Slots: slots[i], Line: i + 1}
	}
	return hosts, nil
}

// Slurm is the hostfile name that means the Slurm allocation's nodes
// (--hostfile slurm; a file of that name is ./slurm).
const Slurm = "slurm"

// ReadHosts returns the hosts of the hostfile at path, or, for path
// Slurm, of the Slurm allocation getenv describes (their slots as
// SlurmHosts counts them without --nproc-per-node), so that every command
// taking --hostfile takes the allocation as gtrain run does.
func ReadHosts(ctx context.Context, path string, getenv func(string) string) ([]Host, error) {
	if path != Slurm {
		return ReadFile(ctx, path)
	}
	hosts, err := SlurmHosts(getenv, 0)
	if err != nil {
		return nil, &usage.Error{Err: fmt.Errorf("--hostfile slurm: %w", err)}
	}
	return hosts, nil
}

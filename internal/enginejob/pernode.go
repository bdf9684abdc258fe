package enginejob

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"

	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
)

// maxRunIDDir bounds the --rdzv-id a per-node run directory is named by.
const maxRunIDDir = 200

// perNodeRunDir names the run directory of a per-node job in runs:
// runs/<run id>. Every node prepares the job on its own, so the name must
// not depend on the node or the time it starts, as a hostfile job's
// runs/<time>-<random> does; --rdzv-id is the same on every node and new
// for every job. Rank 0 creates the directory and refuses one that holds
// another run's checkpoints, as on a hostfile's hosts.
func perNodeRunDir(runs, runID string) (string, error) {
	bad := runID == "" || len(runID) > maxRunIDDir || strings.HasPrefix(runID, ".") ||
		strings.ContainsFunc(runID, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
		})
	if bad {
		return "", usage.Errorf("run: --rdzv-id %q names the per-node job's run directory %s/<rdzv-id>: want at most %d letters, digits, '-', '_' or '.', not starting with '.'; or set checkpoint.dir in the job",
			runID, runs, maxRunIDDir)
	}
	return filepath.Join(runs, runID), nil
}

// Digest is a short digest of the job every rank runs (its resolved spec
// and command): per-node mode refuses a node whose job's digest differs
// from the others', since each node prepares the job from its own flags
// and files.
func (j *Job) Digest() string {
	h := sha256.New()
	for _, s := range j.Command {
		h.Write([]byte(s + "\x00"))
	}
	for _, kv := range j.Env {
		if strings.HasPrefix(kv, rankenv.JobSpec+"=") {
			h.Write([]byte(kv))
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

package enginejob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
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

// planState is an attemptPlanner's state between attempts, as a per-node
// job carries it in its rounds (launch.World.State): each node plans its
// own ranks' spec, and a node that joined at a restart must lay the job
// out as the others do: for the global batch the job started with and
// from the layout the last attempt ran, not from its own first world.
type planState struct {
	Global int        `json:"global"`
	First  int        `json:"first"`
	Cur    train.Spec `json:"cur"`
}

// carried is plan after taking over the state w carries, if any; it
// returns the state after this attempt with the plan.
func (p *attemptPlanner) carried(ctx context.Context, w launch.World) (launch.Planned, error) {
	if w.State != "" {
		var st planState
		if err := json.Unmarshal([]byte(w.State), &st); err != nil || st.Global < 1 || st.First < 1 {
			return launch.Planned{}, fmt.Errorf("run: the job's layout of the last attempt, from the rendezvous: malformed (%v)", err)
		}
		p.global, p.first, p.cur = st.Global, st.First, st.Cur
	}
	out, err := p.plan(ctx, w)
	if err != nil {
		return out, err
	}
	b, err := json.Marshal(planState{Global: p.global, First: p.first, Cur: p.cur})
	if err != nil {
		return out, fmt.Errorf("run: encode the layout of attempt %d: %w", w.Attempt, err)
	}
	out.State = string(b)
	return out, nil
}

// checkFresh refuses a fresh job a directory that holds a run
// (train.CheckFresh), except on a node of a per-node job: a node that
// joins the job at a restart finds the job's own checkpoints there, and
// cannot tell them from another run's. Rank 0 checks in its place (a
// fresh start refuses a used directory; a restart resumes from it).
func (o Options) checkFresh(ctx context.Context, dir string) error {
	if o.PerNode {
		return nil
	}
	return train.CheckFresh(ctx, dir)
}

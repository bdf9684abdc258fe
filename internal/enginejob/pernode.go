package enginejob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/atomicfile"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
	"github.com/gtrain/gtrain/launch"
)

// maxRunIDDir bounds the --rdzv-id a per-node run directory is named by.
const maxRunIDDir = 200

// perNodeRunDir names the run directory of a per-node job in runs:
// runs/<run id>. Every node prepares the job on its own, so the name must
// not depend on the node or the time it starts, as a hostfile job's
// runs/<time>-<random> does; --rdzv-id is the same on every node and new
// for every job, and the same when the scheduler starts the job again.
// Node 0's launcher creates the directory and refuses one that holds
// another job's run (recordRunDir).
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
// joins the job at a restart, or a job its scheduler started again, finds
// the job's own checkpoints there. Node 0's launcher tells them from
// another job's by the digest recorded there (recordRunDir).
func (o Options) checkFresh(ctx context.Context, dir string) error {
	if o.PerNode {
		return nil
	}
	return train.CheckFresh(ctx, dir)
}

// JobRecordName is the file in a per-node job's checkpoint directory that
// names the job whose checkpoints it holds: its --rdzv-id and digest.
const JobRecordName = "gtrain-job.json"

// maxJobRecord bounds the read of a JobRecordName file.
const maxJobRecord = 4 << 10

// jobRecord is the content of a JobRecordName file.
type jobRecord struct {
	RunID  string `json:"rdzv_id"`
	Digest string `json:"digest"`
}

// PerNodePlanner is Planner for one node of a per-node job. On node 0
// it first makes sure, before every attempt's ranks start, that the
// checkpoint directory is this job's (recordRunDir): a scheduler that
// starts every node again with the same --rdzv-id (a Kubernetes pod
// restarted, evicted or preempted) starts the same command, whose ranks
// then resume from the job's newest checkpoint (worker --resume-if-any),
// and the manifest the user wrote once needs no other flag for it.
//
// A job started again on another number of nodes keeps the global batch
// its checkpoint was trained with (resumeGlobal), as an elastic restart
// within one run does: no node has the rounds' state then.
func (j *Job) PerNodePlanner(o PlanOptions) func(context.Context, launch.World) (launch.Planned, error) {
	pl := &attemptPlanner{job: j, o: o, cur: j.Spec, speed: o.Speed}
	return func(ctx context.Context, w launch.World) (launch.Planned, error) {
		if len(w.Hosts) > 0 && w.Hosts[0].Local {
			if err := j.recordRunDir(ctx); err != nil {
				return launch.Planned{}, err
			}
		}
		var from *resumedRun
		if w.State == "" && pl.global == 0 {
			var err error
			if from, err = pl.resumeGlobal(ctx, w.Size); err != nil {
				return launch.Planned{}, err
			}
		}
		out, err := pl.carried(ctx, w)
		switch {
		case from == nil:
		case err != nil:
			err = fmt.Errorf("run: %s was trained with a global batch of %d sequences, which the job started again keeps: %w; or start the job afresh with another --rdzv-id", from.dir, from.global, err)
		default:
			note := fmt.Sprintf("resuming %s (written by %d ranks) on %d: the global batch stays %d sequences, as the run being resumed trained",
				from.dir, from.world, w.Size, from.global)
			out.Notes = append([]string{note}, out.Notes...)
		}
		return out, err
	}
}

// resumedRun is the checkpoint a per-node job started again resumes from,
// where it sets the job's global batch (resumeGlobal).
type resumedRun struct {
	dir    string // the step directory
	world  int    // the ranks that wrote it
	global int    // the sequences per step it was trained with
}

// resumeGlobal starts p, which has planned nothing yet and has no state
// from the rounds, from the global batch of the checkpoint the ranks will
// resume from (the newest valid one, as worker --resume-if-any takes),
// where the job's own spec would train another on world ranks: the job
// was started again by its scheduler on another number of nodes, and
// trains on as the run being resumed did (DeepSpeed's train_batch_size
// stays too). Every node reads the run directory they share, which no
// rank writes to while the job is started again, so all plan alike. It
// returns that checkpoint, nil when nothing changes.
func (p *attemptPlanner) resumeGlobal(ctx context.Context, world int) (*resumedRun, error) {
	dir := p.job.Spec.Checkpoint.Dir
	c, err := ckpt.Latest(ctx, dir, nil)
	switch {
	case errors.Is(err, ckpt.ErrNoCheckpoint):
		return nil, nil // a fresh start: the first world's global batch
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	case err != nil:
		return nil, fmt.Errorf("run: read the checkpoint to resume from, for its global batch: %w; set checkpoint.dir to a directory every node shares and can read", err)
	}
	var was train.Spec
	if err := json.Unmarshal(c.Manifest.Job, &was); err != nil {
		return nil, fmt.Errorf("run: %s: job spec in manifest: %w; resume from another checkpoint (see `gtrain ckpt ls %s`)", c.Dir, err, dir)
	}
	g, err := train.GlobalBatch(was, c.Manifest.Layout.World)
	if err != nil {
		return nil, fmt.Errorf("run: %s: the global batch it was trained with: %w", c.Dir, err)
	}
	if own, err := train.GlobalBatch(p.job.Spec, world); err == nil && own == g {
		return nil, nil
	}
	// Refit keeps the accumulation the checkpoint ran where it can: the
	// same micro-steps see the data the uninterrupted run's would.
	p.global, p.first = g, c.Manifest.Layout.World
	p.cur.Batch.GradAccum = was.Batch.GradAccum
	return &resumedRun{dir: c.Dir, world: c.Manifest.Layout.World, global: g}, nil
}

// recordRunDir checks that the job's checkpoint directory holds this
// job's run, or none: its JobRecordName must name this job's digest. A
// directory without one must hold no checkpoint; the record is then
// written, creating the directory. Node 0's launcher runs where rank 0
// does and sees the directory as it does.
func (j *Job) recordRunDir(ctx context.Context) error {
	dir := j.Spec.Checkpoint.Dir
	path := filepath.Join(dir, JobRecordName)
	b, err := userfile.Read(ctx, path, maxJobRecord)
	switch {
	case err == nil:
		return j.checkRecord(path, b)
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("run: %w; remove it if the directory holds no run, or choose another --rdzv-id", err)
	}
	if err := train.CheckFresh(ctx, dir); err != nil {
		if errors.As(err, new(*train.UsedDirError)) {
			return usage.Errorf("run: %w (it has no %s naming the job that wrote it, so this job cannot resume there)", err, JobRecordName)
		}
		return err
	}
	rec, err := json.Marshal(jobRecord{RunID: j.perNodeID, Digest: j.Digest()})
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		err = createRecord(path, append(rec, '\n'))
	}
	if errors.Is(err, fs.ErrExist) {
		// Another job's node 0 with this --rdzv-id recorded its job since
		// the read above: the first record stands, and decides.
		return j.recordedSince(ctx, path)
	}
	if err != nil {
		return fmt.Errorf("run: record the job in %s: %w; set checkpoint.dir to a directory every node shares and can write to", dir, err)
	}
	return nil
}

// recordedSince checks the record another launcher created at path
// while this one prepared its own.
func (j *Job) recordedSince(ctx context.Context, path string) error {
	b, err := userfile.Read(ctx, path, maxJobRecord)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("run: %w; remove it if the directory holds no run, or choose another --rdzv-id", err)
	}
	return j.checkRecord(path, b)
}

// beforeCreate, when set (by tests), runs before createRecord creates
// the record: two writers held there have both found none.
var beforeCreate func()

// createRecord creates path holding b, or fails with fs.ErrExist when it
// exists: of two jobs started at the same moment with one --rdzv-id, the
// first to create the record wins, and the other reads it. b is written
// whole to a temporary file first and linked into place: link(2), unlike
// the rename of an atomic write, never replaces a file, and no reader
// sees a part of one, as it could of a file created with O_EXCL and then
// written. A file system without hard links (some FUSE mounts of object
// stores) gets O_EXCL.
func createRecord(path string, b []byte) error {
	if beforeCreate != nil {
		beforeCreate()
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+atomicfile.TempMarker+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = writeSynced(f, b)
	if err == nil {
		err = os.Chmod(tmp, 0o644) // CreateTemp's 0600 would hide the record from other users' tools
	}
	if err != nil {
		return err
	}
	switch err = os.Link(tmp, path); {
	case err == nil:
		return atomicfile.SyncDir(dir)
	case errors.Is(err, fs.ErrExist):
		return err
	case errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EMLINK):
		return createExclusive(path, b)
	}
	return err
}

// createExclusive creates path holding b with O_EXCL, where the file
// system has no hard links.
func createExclusive(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if err := writeSynced(f, b); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}

// writeSynced writes b to f, syncs and closes it.
func writeSynced(f *os.File, b []byte) error {
	_, err := f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkRecord refuses a checkpoint directory whose record b (read from
// path) names another job than j.
func (j *Job) checkRecord(path string, b []byte) error {
	var rec jobRecord
	err := json.Unmarshal(b, &rec)
	if err == nil && rec.Digest == "" {
		err = errors.New("no digest")
	}
	if err != nil {
		return fmt.Errorf("run: %s: malformed job record: %w; remove it if the directory holds no run, or choose another --rdzv-id", path, err)
	}
	if rec.Digest != j.Digest() {
		return usage.Errorf("run: %s holds the run of another job with --rdzv-id %s (job digest %s, recorded in %s), not this one (job digest %s): a job started again needs the same --job, --set and working directory on every node; a new job needs a new --rdzv-id",
			filepath.Dir(path), rec.RunID, rec.Digest, JobRecordName, j.Digest())
	}
	return nil
}

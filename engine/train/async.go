package train

import (
	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/zero"
	"github.com/gtrain/gtrain/planner"
)

// Asynchronous checkpoints (checkpoint.async). At a checkpoint's step
// boundary each rank checks its state is finite (as a synchronous save
// does), copies what it saves into a host-memory snapshot and trains on;
// a goroutine writes the rank's file from the snapshot. The protocol is
// the synchronous one, split into phases that end at step boundaries:
//
//	writing     every rank's goroutine writes its file (ckpt.WriteShard/WriteParts)
//	            ─► all-gather of (size, sha256) on the training thread
//	committing  rank 0's goroutine commits (manifest last, atomically; prune)
//	            ─► broadcast of rank 0's outcome on the training thread: collected
//
// So rank 0 still commits only once every rank's file is written, and no
// collective is issued from a goroutine: a communicator's collectives must
// come in the same order on every rank, which a goroutine running beside
// training's own could not keep (and a second communicator would double
// every rank's links). The ranks learn that a phase may end on every rank
// from the all-reduce each step already makes of the loss: each adds 1
// while its goroutine runs (busy), and the phase ends at the first step
// boundary where the sum is 0 — the same boundary on every rank, so the
// phase's collective is issued by all of them together. A phase's error
// surfaces there, one or two steps after the write, as the synchronous
// save's would have. The next checkpoint, the final one, the preemption
// checkpoint and the end of the run wait for the phases in flight
// (finishSaves), so the job does not exit before the commit is durable.
// A SIGKILL at any moment leaves what the atomic protocol leaves: the
// newest committed checkpoint, and temporary files that Commit removes.
//
// The cost is memory: one copy of what the rank saves (12 bytes a saved
// parameter: fp32 masters and both Adam moments, a 1/N share of the model
// on N data-parallel ranks), allocated at the first checkpoint and reused
// (snapshotEstimate counts it for the memory check, MemoryUse.Snapshot
// reports it). The step that saves still checks the state is finite and
// copies it; docs/benchmarks.md has the figures.

// savePhase is where an asynchronous checkpoint is.
type savePhase int

const (
	saveIdle       savePhase = iota
	saveWriting              // every rank's goroutine writes its file
	saveCommitting           // rank 0's goroutine commits
)

// asyncSave is a rank's asynchronous checkpoint: the snapshot and the
// phase in flight.
type asyncSave struct {
	snap  snapshot
	phase savePhase
	step  int
	done  chan struct{} // closed when the phase's goroutine has ended
	file  ckpt.File     // writing's outcome
	err   error         // writing's or committing's error
	warns []string      // committing's warnings, said on the training thread
	// settled: the last step's all-reduce said that no rank's goroutine
	// of this phase runs any more.
	settled bool
}

// testHookAsyncWrite, when set by a test, is called by the goroutine that
// writes a rank's file before it writes (to hold the write while
// training goes on).
var testHookAsyncWrite func(rank, step int)

// saveBusy is this rank's part of the step's all-reduce: 1 while its
// goroutine of the current phase runs, else 0.
func (t *Trainer) saveBusy() float32 {
	a := t.async
	if a == nil || a.phase == saveIdle {
		return 0
	}
	select {
	case <-a.done:
		return 0
	default:
		return 1
	}
}

// noteSaves takes the step's all-reduced saveBusy (a sum or a mean over
// the ranks): 0 means the current phase may end at this step's boundary.
func (t *Trainer) noteSaves(busy float32) {
	if a := t.async; a != nil && a.phase != saveIdle {
		a.settled = busy == 0
	}
}

// saveAsync checks the state is finite, as save does, then copies it
// into the snapshot and starts writing it. Every rank calls it at the
// same step; the previous checkpoint must be finished (finishSaves).
func (t *Trainer) saveAsync() error {
	if err := t.checkFinite(); err != nil {
		return err
	}
	s, err := t.capture()
	if err != nil {
		return err
	}
	a := t.async
	first := a.snap.bytes() == 0
	a.snap.take(&s)
	if first {
		t.logf("checkpoint.async: step %d on: each checkpoint is written in the background from a copy in host memory (%s per rank)",
			s.step, humanBytes(float64(a.snap.bytes())))
	}
	a.phase, a.step, a.settled, a.err, a.warns = saveWriting, s.step, false, nil, nil
	a.done = make(chan struct{})
	go func() {
		defer close(a.done)
		if testHookAsyncWrite != nil {
			testHookAsyncWrite(s.rank, s.step)
		}
		a.file, a.err = s.write()
	}()
	return nil
}

// advanceSaves ends the current phase if every rank's goroutine has
// ended (the last all-reduce said so), issuing its collective, and
// returns the step directory when that completed the checkpoint. Every
// rank calls it at every step boundary.
func (t *Trainer) advanceSaves() (string, error) {
	if a := t.async; a == nil || a.phase == saveIdle || !a.settled {
		return "", nil
	}
	return t.endPhase()
}

// endPhase ends the current phase, whose goroutine has ended on this rank
// (the other ranks end it at the same point): writing's all-gather, then
// rank 0 starts committing; committing's broadcast, which completes the
// checkpoint.
func (t *Trainer) endPhase() (string, error) {
	a := t.async
	<-a.done
	a.settled = false
	if a.phase == saveWriting {
		files, err := t.shareFiles(a.file, a.err)
		a.phase, a.err, a.done = saveCommitting, err, make(chan struct{})
		if err != nil || t.env.Rank != 0 {
			close(a.done)
			return "", nil
		}
		go func() {
			defer close(a.done)
			a.err = t.commit(a.step, files, func(w string) { a.warns = append(a.warns, w) })
		}()
		return "", nil
	}
	for _, w := range a.warns {
		t.env.Warn(w)
	}
	a.phase = saveIdle
	dir, err := t.agreeSaved(a.step, a.err)
	if err == nil {
		t.saved = dir
	}
	return dir, err
}

// finishSaves waits for the checkpoint in flight, if any, and completes
// it: before the next checkpoint, at the last step and at the end of the
// run. Every rank calls it at the same step. It returns the step
// directory of a checkpoint it completed.
func (t *Trainer) finishSaves() (string, error) {
	var dir string
	for t.async != nil && t.async.phase != saveIdle {
		d, err := t.endPhase()
		if err != nil {
			return "", err
		}
		if d != "" {
			dir = d
		}
	}
	return dir, nil
}

// abandonSaves waits for this rank's goroutine, if one runs, without the
// collectives that would complete its checkpoint: the run is failing,
// and the other ranks may not come. A file it wrote is no checkpoint
// until committed; a commit it finished is one (every rank's file was
// written).
func (t *Trainer) abandonSaves() {
	if a := t.async; a != nil && a.phase != saveIdle {
		<-a.done
		a.phase = saveIdle
	}
}

// checkpointAfter does what a step's boundary asks of checkpoints: it
// advances an asynchronous checkpoint in flight, then saves when one is
// due or the job stops. A checkpoint whose write goes on in the
// background is recorded in res when it completes; the final and the
// preemption checkpoint are written at once.
func (t *Trainer) checkpointAfter(res *Result, stop bool) error {
	dir, err := t.advanceSaves()
	if dir != "" {
		res.Checkpoint = dir
	}
	if err != nil {
		return err
	}
	if !t.checkpointDue() && !(stop && t.spec.Checkpoint.Dir != "") {
		return nil
	}
	if dir, err = t.finishSaves(); dir != "" {
		res.Checkpoint = dir
	}
	if err != nil {
		return err
	}
	if t.async != nil && !stop && t.step < t.spec.Steps {
		return t.saveAsync()
	}
	res.Checkpoint, err = t.save()
	return err
}

// snapshot is the host-memory copy of what a rank saves. Its buffer is
// allocated at the first checkpoint and reused by every later one: the
// saved tensors keep their sizes for the whole run.
type snapshot struct {
	buf []float32
}

// take copies the tensors of s into the snapshot and points s at the
// copies.
func (p *snapshot) take(s *rankSave) {
	n := 0
	for _, t := range s.shard {
		n += len(t.Data)
	}
	for _, t := range s.parts {
		n += len(t.Data)
	}
	if cap(p.buf) < n {
		p.buf = make([]float32, n)
	}
	buf := p.buf[:n]
	next := func(src []float32) []float32 {
		dst := buf[:len(src):len(src)]
		copy(dst, src)
		buf = buf[len(src):]
		return dst
	}
	for i := range s.shard {
		s.shard[i].Data = next(s.shard[i].Data)
	}
	for i := range s.parts {
		s.parts[i].Data = next(s.parts[i].Data)
	}
}

// bytes is the memory the snapshot holds.
func (p *snapshot) bytes() int64 { return 4 * int64(cap(p.buf)) }

// snapshotBytes is what the rank's snapshot holds (0 without
// checkpoint.async, and before its first checkpoint).
func (t *Trainer) snapshotBytes() int64 {
	if t.async == nil {
		return 0
	}
	return t.async.snap.bytes()
}

// snapshotEstimate is the snapshot of rank of world under checkpoint.async
// (0 without): the fp32 master weights and both Adam moments of the part
// the rank saves, the elements it would own at ZeRO-1 whatever its stage.
// Under tensor and pipeline parallelism it is a share of the model as
// gridEstimate counts it.
func snapshotEstimate(spec Spec, zc zero.Config, world, rank int) float64 {
	if !spec.Checkpoint.Async || spec.Checkpoint.Dir == "" {
		return 0
	}
	zc.Stage, zc.Params = max(zc.Stage, 1), comm.Float32 // Optimizer: the two moments, 8 bytes an element
	p := spec.Parallel
	if mp := p.ModelParallel(); mp > 1 {
		grid := planner.Grid{TP: p.TP, PP: p.PP, DP: max(p.DP, 1)}
		z := zero.Estimate(zc, spec.Model.Config, grid.DP, grid.Coord(rank).DP)
		return 1.5 * float64(z.Optimizer) / float64(mp)
	}
	return 1.5 * float64(zero.Estimate(zc, spec.Model.Config, world, rank).Optimizer)
}

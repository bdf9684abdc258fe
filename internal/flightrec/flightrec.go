// Package flightrec is the flight record of a rank's collectives: the JSON
// a rank of the built-in engine writes when it is asked why it hangs
// (rank-R.hang.json in the attempt's log directory), its bounded decoder,
// and Analyze, which reads every rank's record and says which rank the
// others wait for and in which call: the NCCL flight recorder's question.
//
// The engine (engine/comm, engine/train) writes records and the launcher
// reads them; the launcher must not import the engine, so the format lives
// here, with the standard library only.
package flightrec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Version is the format's version; Decode refuses any other.
const Version = 1

// Bounds on a record, checked by Decode: a record is written by a rank,
// but read by the launcher from a directory anyone may write to.
const (
	MaxBytes     = 8 << 20 // one file
	MaxGroups    = 256     // communicators of one rank
	MaxOps       = 4096    // ops kept per communicator
	MaxRanks     = 1 << 16 // ranks of a group or the world
	MaxErrorText = 1024    // Op.Error, in bytes
)

// State is where an operation stands.
type State string

// The states of an operation.
const (
	Pending State = "pending" // started, not finished: the rank is in it now
	Done    State = "done"
	Failed  State = "failed" // returned an error (timeout, peer gone, mismatch, cancelled)
)

// Dump is one rank's flight record.
type Dump struct {
	Version int       `json:"version"`
	Rank    int       `json:"rank"` // world rank
	Host    string    `json:"host,omitempty"`
	PID     int       `json:"pid,omitempty"`
	Reason  string    `json:"reason"` // why it was written: "signal", "timeout", "error"
	Time    time.Time `json:"time"`
	Groups  []Group   `json:"groups"`
}

// Group is the record of one communicator (the world, or a group Split
// made: tp, pp, dp, embedding).
type Group struct {
	Name    string `json:"name"`
	Ranks   []int  `json:"ranks"`   // the world rank of each group rank
	Rank    int    `json:"rank"`    // this rank's group rank
	Dropped uint64 `json:"dropped"` // operations older than Ops, no longer kept
	Ops     []Op   `json:"ops"`     // the last operations, oldest first
}

// Op is one operation of a communicator.
type Op struct {
	Op string `json:"op"` // all_reduce, reduce_scatter, …, send, recv, send_recv, split
	// Seq numbers the group's collectives in issue order, the same on every
	// rank. For point-to-point operations it is the count of earlier
	// messages between the two ranks (Recv's for recv and send_recv).
	Seq   uint64 `json:"seq"`
	P2P   bool   `json:"p2p,omitempty"`
	To    int    `json:"to"`   // p2p: group rank sent to; -1 if none
	From  int    `json:"from"` // p2p: group rank received from; -1 if none
	DType string `json:"dtype,omitempty"`
	Count int64  `json:"count"`
	Bytes int64  `json:"bytes"`
	State State  `json:"state"`
	// Waiting is the group rank the operation waits on now (pending), or
	// waited on last; -1 if none is known.
	Waiting int       `json:"waiting"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end,omitzero"`
	Error   string    `json:"error,omitempty"`
}

// Encode writes d as indented JSON.
func Encode(w io.Writer, d *Dump) error {
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return fmt.Errorf("flightrec: encode rank %d: %w", d.Rank, err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Decode reads one record of at most MaxBytes and checks it against the
// format's bounds.
func Decode(r io.Reader) (*Dump, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("flightrec: read: %w", err)
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("flightrec: record larger than %d bytes", MaxBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d Dump
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("flightrec: decode: %w", err)
	}
	if err := d.check(); err != nil {
		return nil, fmt.Errorf("flightrec: rank %d: %w", d.Rank, err)
	}
	return &d, nil
}

func (d *Dump) check() error {
	switch {
	case d.Version != Version:
		return fmt.Errorf("version %d, want %d (written by another gtrain)", d.Version, Version)
	case d.Rank < 0 || d.Rank >= MaxRanks:
		return fmt.Errorf("rank %d out of range", d.Rank)
	case len(d.Groups) > MaxGroups:
		return fmt.Errorf("%d groups, at most %d", len(d.Groups), MaxGroups)
	}
	for i := range d.Groups {
		if err := d.Groups[i].check(d.Rank); err != nil {
			return fmt.Errorf("group %q: %w", d.Groups[i].Name, err)
		}
	}
	return nil
}

func (g *Group) check(world int) error {
	n := len(g.Ranks)
	switch {
	case n == 0 || n > MaxRanks:
		return fmt.Errorf("%d ranks, want 1 to %d", n, MaxRanks)
	case g.Rank < 0 || g.Rank >= n:
		return fmt.Errorf("rank %d out of range for %d ranks", g.Rank, n)
	case g.Ranks[g.Rank] != world:
		return fmt.Errorf("group rank %d is world rank %d, not the record's %d", g.Rank, g.Ranks[g.Rank], world)
	case len(g.Ops) > MaxOps:
		return fmt.Errorf("%d ops, at most %d", len(g.Ops), MaxOps)
	}
	for _, r := range g.Ranks {
		if r < 0 || r >= MaxRanks {
			return fmt.Errorf("world rank %d out of range", r)
		}
	}
	for i, op := range g.Ops {
		if err := op.check(n); err != nil {
			return fmt.Errorf("op %d (%s #%d): %w", i, op.Op, op.Seq, err)
		}
	}
	return nil
}

func (op *Op) check(n int) error {
	inGroup := func(r int) bool { return r >= -1 && r < n }
	switch {
	case op.State != Pending && op.State != Done && op.State != Failed:
		return fmt.Errorf("state %q, want pending, done or failed", op.State)
	case !inGroup(op.To) || !inGroup(op.From) || !inGroup(op.Waiting):
		return errors.New("a peer (to, from, waiting) outside the group")
	case len(op.Error) > MaxErrorText:
		return fmt.Errorf("error text of %d bytes, at most %d", len(op.Error), MaxErrorText)
	}
	return nil
}

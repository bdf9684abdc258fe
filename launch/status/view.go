// Package status models the state of a gtrain job from its event stream and
// shows it: as prefixed output lines, as JSON lines, as a live table on the
// terminal, and as per-rank log files.
//
// The launcher builds one View (often a Multi), calls Event for every event in
// order from one goroutine, and calls Close once when the job is over.
package status

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/gtrain/gtrain/launch/proto"
)

// View consumes the event stream of a job. Event is called from a single
// goroutine, in order. Close flushes; the table view erases its live table
// and prints a final static one. Write errors are remembered by Event and
// returned by Close.
type View interface {
	Event(ev proto.Event)
	Close() error
}

// Multi fans one event stream out to several views, in the order given. Its
// Close closes every view and joins their errors. Nil views are skipped.
func Multi(views ...View) View {
	var vs multi
	for _, v := range views {
		if v != nil {
			vs = append(vs, v)
		}
	}
	return vs
}

type multi []View

func (vs multi) Event(ev proto.Event) {
	for _, v := range vs {
		v.Event(ev)
	}
}

func (vs multi) Close() error {
	var errs []error
	for _, v := range vs {
		errs = append(errs, v.Close())
	}
	return errors.Join(errs...)
}

// NewLines returns a view that prints rank output, one whole line per write:
// rank stdout to stdout, rank stderr to stderr, each line prefixed with
// "[rank 3] ", or with "[worker-1:3] " (host:rank) when multiHost is true.
// A partial line (ev.Partial) is printed as a whole line too, so lines from
// different ranks never interleave mid-line. Notice events go to stderr as
// "gtrain: <message>". Other events print nothing.
func NewLines(stdout, stderr io.Writer, multiHost bool) View {
	return &linesView{stdout: stdout, stderr: stderr, multiHost: multiHost}
}

type linesView struct {
	stdout, stderr io.Writer
	multiHost      bool
	err            error // first write error
}

func (v *linesView) Event(ev proto.Event) {
	w, line := routeLine(ev, v.stdout, v.stderr, v.multiHost)
	if w == nil {
		return
	}
	if _, err := w.Write(line); err != nil && v.err == nil {
		v.err = fmt.Errorf("status: write output: %w", err)
	}
}

func (v *linesView) Close() error { return v.err }

// routeLine returns the writer and the newline-terminated text that ev
// prints as a line, or a nil writer if ev prints nothing.
func routeLine(ev proto.Event, stdout, stderr io.Writer, multiHost bool) (io.Writer, []byte) {
	switch ev.Type {
	case proto.EventLog:
		w := stdout
		if ev.Stream == "stderr" {
			w = stderr
		}
		b := appendPrefix(nil, ev, multiHost)
		b = append(b, ev.Line...)
		return w, append(b, '\n')
	case proto.EventNotice:
		b := append([]byte("gtrain: "), ev.Message...)
		return stderr, append(b, '\n')
	}
	return nil, nil
}

// appendPrefix appends "[rank 3] " or, for multi-host jobs, "[host:3] ".
func appendPrefix(b []byte, ev proto.Event, multiHost bool) []byte {
	if multiHost {
		b = append(b, '[')
		b = append(b, ev.Host...)
		b = append(b, ':')
	} else {
		b = append(b, "[rank "...)
	}
	b = strconv.AppendInt(b, int64(ev.Rank), 10)
	return append(b, "] "...)
}

// NewJSON returns a view that writes every event as one JSON line to w, in
// the protocol's encoding, so that proto.Decoder reads it back. Events made
// by the launcher without a version get proto.Version.
func NewJSON(w io.Writer) View {
	return &jsonView{enc: proto.NewEncoder(w)}
}

type jsonView struct {
	enc *proto.Encoder
	err error // first write error
}

func (v *jsonView) Event(ev proto.Event) {
	if ev.V == 0 {
		ev.V = proto.Version
	}
	if err := v.enc.Encode(ev); err != nil && v.err == nil {
		v.err = fmt.Errorf("status: write json: %w", err)
	}
}

func (v *jsonView) Close() error { return v.err }

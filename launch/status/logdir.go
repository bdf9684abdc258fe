package status

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/launch/proto"
)

// NewLogDir returns a view that writes one file per rank per attempt,
// <dir>/<runID>/attempt-<attempt>/rank-<rank>.log, holding that rank's output
// lines from both streams in arrival order, each newline-terminated. It
// creates the attempt directory (0755, parents too) and refuses one that
// already exists, so that a rerun never mixes with or truncates old logs.
// A file (0644) is created on its rank's first line.
//
// Output is buffered; it is flushed when the rank exits, on heartbeats and
// on done, so the files trail the job by at most a heartbeat. Close flushes
// and closes every file and returns the first error of each file.
func NewLogDir(dir, runID string, attempt int) (View, error) {
	if runID == "" || runID == "." || runID == ".." || strings.ContainsAny(runID, `/\`) {
		return nil, fmt.Errorf("status: log dir: invalid run id %q", runID)
	}
	parent := filepath.Join(dir, runID)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("status: log dir: %w", err)
	}
	path := filepath.Join(parent, "attempt-"+strconv.Itoa(attempt))
	if err := os.Mkdir(path, 0o755); err != nil {
		return nil, fmt.Errorf("status: log dir: %w", err)
	}
	return &logDir{dir: path, files: make(map[int]*rankLog)}, nil
}

type logDir struct {
	dir   string
	files map[int]*rankLog
}

// rankLog is one rank's log file. After its first error it writes nothing
// more and keeps the error for Close.
type rankLog struct {
	f   *os.File
	w   *bufio.Writer
	err error
}

func (d *logDir) Event(ev proto.Event) {
	switch ev.Type {
	case proto.EventLog:
		if ev.Rank >= 0 {
			d.write(ev.Rank, ev.Line)
		}
	case proto.EventRankExited:
		if l := d.files[ev.Rank]; l != nil {
			l.flush()
		}
	case proto.EventHeartbeat, proto.EventDone, proto.EventJobExited:
		for _, l := range d.files {
			l.flush()
		}
	}
}

func (d *logDir) write(rank int, line string) {
	l := d.files[rank]
	if l == nil {
		l = &rankLog{}
		d.files[rank] = l
		name := filepath.Join(d.dir, "rank-"+strconv.Itoa(rank)+".log")
		// O_EXCL: never write into a file we did not create.
		l.f, l.err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if l.err != nil {
			l.err = fmt.Errorf("status: log file: %w", l.err)
			return
		}
		l.w = bufio.NewWriterSize(l.f, 32<<10)
	}
	if l.err != nil {
		return
	}
	l.w.WriteString(line)
	if err := l.w.WriteByte('\n'); err != nil {
		l.err = fmt.Errorf("status: write %s: %w", l.f.Name(), err)
	}
}

func (l *rankLog) flush() {
	if l.err == nil {
		if err := l.w.Flush(); err != nil {
			l.err = fmt.Errorf("status: write %s: %w", l.f.Name(), err)
		}
	}
}

func (d *logDir) Close() error {
	var errs []error
	for _, l := range d.files {
		l.flush()
		errs = append(errs, l.err)
		if l.f != nil {
			if err := l.f.Close(); err != nil {
				errs = append(errs, fmt.Errorf("status: close log file: %w", err))
			}
		}
	}
	clear(d.files)
	return errors.Join(errs...)
}

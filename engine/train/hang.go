package train

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/atomicfile"
	"github.com/gtrain/gtrain/internal/flightrec"
	"github.com/gtrain/gtrain/internal/rankenv"
)

// DumpSignal asks a rank of the built-in engine to write its flight record
// and goroutine stacks (HangDumper). SIGUSR2 because nothing else in gtrain
// uses it: SIGTERM and SIGUSR1 are preemption, SIGQUIT would kill the rank.
var DumpSignal os.Signal = syscall.SIGUSR2

// maxStackBytes bounds rank-R.stacks.txt: a rank with many goroutines must
// not fill the log directory.
const maxStackBytes = 16 << 20

// HangDumper writes a rank's hang diagnosis into a directory: its flight
// record (rank-R.hang.json, the last operations of every communicator,
// internal/flightrec) and its goroutine stacks (rank-R.stacks.txt), each
// atomically. Safe for concurrent use.
type HangDumper struct {
	Dir  string // the attempt's log directory (GTRAIN_DUMP_DIR)
	Rank int    // world rank
	Host string

	mu     sync.Mutex
	dumped bool
}

// Dump writes both files, saying why (reason: "signal", "timeout",
// "error"), and returns the flight record's path.
func (d *HangDumper) Dump(reason string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dumped = true
	host, _ := os.Hostname()
	if d.Host != "" {
		host = d.Host
	}
	rec := &flightrec.Dump{Version: flightrec.Version, Rank: d.Rank, Host: host, PID: os.Getpid(),
		Reason: reason, Time: time.Now().UTC(), Groups: d.groups()}
	base := filepath.Join(d.Dir, "rank-"+strconv.Itoa(d.Rank))
	err := atomicfile.Write(base+".hang.json", func(w io.Writer) error { return flightrec.Encode(w, rec) })
	if err != nil {
		return "", fmt.Errorf("train: write the flight record of rank %d: %w", d.Rank, err)
	}
	err = atomicfile.Write(base+".stacks.txt", func(w io.Writer) error {
		var buf bytes.Buffer
		if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
			return err
		}
		if buf.Len() > maxStackBytes {
			buf.Truncate(maxStackBytes)
			buf.WriteString("\n… truncated at 16 MiB\n")
		}
		_, err := w.Write(buf.Bytes())
		return err
	})
	if err != nil {
		return "", fmt.Errorf("train: write the goroutine stacks of rank %d: %w", d.Rank, err)
	}
	return base + ".hang.json", nil
}

// groups returns the flight records of this rank's communicators: a
// process holding several ranks (tests) has the others' too.
func (d *HangDumper) groups() []flightrec.Group {
	var out []flightrec.Group
	for _, g := range comm.FlightRecords() {
		if g.Ranks[g.Rank] == d.Rank {
			out = append(out, g)
		}
	}
	return out
}

// DumpFailure dumps when err is a collective's failure and nothing was
// dumped before: a dump the launcher asked for shows the hang as it was,
// before the teardown made the collectives fail.
func (d *HangDumper) DumpFailure(err error) (string, bool, error) {
	if _, ok := errors.AsType[*comm.OpError](err); !ok {
		return "", false, nil
	}
	d.mu.Lock()
	dumped := d.dumped
	d.mu.Unlock()
	if dumped {
		return "", false, nil
	}
	reason := "error"
	if errors.Is(err, comm.ErrTimeout) {
		reason = "timeout"
	}
	path, derr := d.Dump(reason)
	return path, true, derr
}

// armDumps makes the rank dump on DumpSignal while it runs, into
// GTRAIN_DUMP_DIR (nothing to arm without it). The function it returns
// takes Run's error, dumps if a collective failed, and disarms.
func (o RankOptions) armDumps(env Env) func(error) {
	dir := o.Getenv(rankenv.DumpDir)
	if dir == "" {
		return func(error) {}
	}
	d := &HangDumper{Dir: dir, Rank: env.Rank, Host: env.Host}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, DumpSignal)
	if env.Status != nil { // the launcher signals only ranks that say they take it
		fmt.Fprintf(env.Status, "{\"dump_signal\":%q}\n", "SIGUSR2")
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-sigc:
				o.reportDump(d.Dump("signal"))
			case <-stop:
				return
			}
		}
	}()
	return func(err error) {
		signal.Stop(sigc)
		close(stop)
		<-done
		if path, ok, derr := d.DumpFailure(err); ok {
			o.reportDump(path, derr)
		}
	}
}

// reportDump says on stderr where the dump went, or why it did not.
func (o RankOptions) reportDump(path string, err error) {
	if o.Warn == nil {
		return
	}
	if err != nil {
		o.Warn(err.Error())
		return
	}
	o.Warn("wrote the flight record " + path + " and the goroutine stacks beside it")
}

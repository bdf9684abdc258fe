package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/comm/commtest"
	"github.com/gtrain/gtrain/internal/flightrec"
	"github.com/gtrain/gtrain/internal/rankenv"
)

// openPair returns two in-process ranks of a communicator named name.
func openPair(t *testing.T, name string, timeout time.Duration) []*comm.Communicator {
	t.Helper()
	trs := comm.NewInProc(2)
	commtest.CloseAtEnd(t, trs)
	cs := commtest.Open(context.Background(), t, 2, func(ctx context.Context, r int) (*comm.Communicator, error) {
		return comm.New(ctx, r, 2, trs[r], comm.Options{Name: name, Timeout: timeout})
	})
	commtest.CloseAtEnd(t, cs)
	return cs
}

// readDump decodes dir's flight record of rank and returns it with its
// group named name.
func readDump(t *testing.T, dir string, rank int, name string) (*flightrec.Dump, flightrec.Group) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "rank-"+string(rune('0'+rank))+".hang.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := flightrec.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range d.Groups {
		if g.Name == name {
			return d, g
		}
	}
	t.Fatalf("the record has no group %s: %+v", name, d.Groups)
	return nil, flightrec.Group{}
}

// TestHangDumperWrites: the flight record holds the process's
// communicators, and the stacks file the goroutines.
func TestHangDumperWrites(t *testing.T) {
	cs := openPair(t, "hangtest-writes", time.Minute)
	commtest.Must(t, 2, nil, func(r int) error { return cs[r].Barrier(context.Background()) })
	dir := t.TempDir()
	d := &HangDumper{Dir: dir, Rank: 1, Host: "node-b"}
	path, err := d.Dump("signal")
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "rank-1.hang.json") {
		t.Errorf("path %s", path)
	}
	rec, g := readDump(t, dir, 1, "hangtest-writes")
	if rec.Reason != "signal" || rec.Host != "node-b" || rec.Rank != 1 || rec.PID != os.Getpid() {
		t.Errorf("record %+v", rec)
	}
	if len(g.Ops) != 1 || g.Ops[0].Op != "barrier" || g.Ops[0].State != flightrec.Done {
		t.Errorf("group ops %+v, want one done barrier", g.Ops)
	}
	stacks, err := os.ReadFile(filepath.Join(dir, "rank-1.stacks.txt"))
	if err != nil || !strings.Contains(string(stacks), "TestHangDumperWrites") {
		t.Errorf("stacks (%v) lack this test's goroutine:\n%.300s", err, stacks)
	}
}

// TestHangDumperFailure: a collective's timeout dumps with reason
// "timeout"; other errors do not dump, nor does a failure after a dump.
func TestHangDumperFailure(t *testing.T) {
	cs := openPair(t, "hangtest-failure", 100*time.Millisecond)
	err := cs[0].Barrier(context.Background()) // rank 1 never comes
	if !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("barrier alone: %v", err)
	}
	dir := t.TempDir()
	d := &HangDumper{Dir: dir, Rank: 0}
	if _, ok, _ := d.DumpFailure(errors.New("data: bad file")); ok {
		t.Error("an error that is not a collective's dumped")
	}
	if _, ok, derr := d.DumpFailure(err); !ok || derr != nil {
		t.Fatalf("a timeout did not dump: %v %v", ok, derr)
	}
	rec, g := readDump(t, dir, 0, "hangtest-failure")
	last := g.Ops[len(g.Ops)-1]
	if rec.Reason != "timeout" || last.State != flightrec.Failed || last.Waiting != 1 {
		t.Errorf("reason %q, last op %+v", rec.Reason, last)
	}
	if _, ok, _ := d.DumpFailure(err); ok {
		t.Error("a second failure dumped over the first dump")
	}
}

// TestArmDumpsSignal: the dump signal makes an armed rank write its files
// into GTRAIN_DUMP_DIR.
func TestArmDumpsSignal(t *testing.T) {
	dir := t.TempDir()
	var warned []string
	o := RankOptions{Getenv: func(k string) string {
		if k == rankenv.DumpDir {
			return dir
		}
		return ""
	}, Warn: func(s string) { warned = append(warned, s) }}
	end := o.armDumps(Env{Rank: 3})
	if err := syscall.Kill(os.Getpid(), DumpSignal.(syscall.Signal)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rank-3.hang.json")
	deadline := time.Now().Add(30 * time.Second) // a backstop: the signal arrives at once
	for {
		if _, err := os.Stat(path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no flight record 30s after the dump signal")
		}
		time.Sleep(5 * time.Millisecond) // polling for the file, not waiting for it
	}
	end(nil) // waits for the handler: warned is safe to read after
	if len(warned) != 1 || !strings.Contains(warned[0], path) {
		t.Errorf("warnings %q, want one naming %s", warned, path)
	}
}

// TestStatusWaitMillis: a data-parallel rank's status records say how
// much of each step it spent blocked in collectives: some, and never more
// than the step.
func TestStatusWaitMillis(t *testing.T) {
	const n = 2
	bufs := make([]bytes.Buffer, n)
	runRanks(t, dpSpec(0, n), n, func(e *Env) { e.Status = &bufs[e.Rank] })
	for r := range n {
		var recs int
		var waited float64
		for line := range strings.Lines(bufs[r].String()) {
			var rec Record
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("rank %d: %v: %s", r, err, line)
			}
			if rec.WaitMillis < 0 || rec.WaitMillis > rec.StepMillis {
				t.Errorf("rank %d step %d: comm_wait_ms %v outside [0, step_ms %v]", r, rec.Step, rec.WaitMillis, rec.StepMillis)
			}
			recs++
			waited += rec.WaitMillis
		}
		if recs == 0 || waited == 0 {
			t.Errorf("rank %d: %d records, %v ms blocked in all: want records, and blocking in the all-reduces", r, recs, waited)
		}
	}
}

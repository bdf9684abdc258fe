package data

import (
	"errors"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// mappedFile writes n tokens (several pages) as a token file and opens it.
func mappedFile(t *testing.T, n int) (string, *Tokens) {
	t.Helper()
	toks := make([]uint16, n)
	for i := range toks {
		toks[i] = uint16(i % ByteVocabSize)
	}
	path := writeRaw(t, "train.bin", le(toks...))
	tok, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tok.Close() })
	if tok.mapped == nil {
		t.Skip("the file is read, not mapped, on a big-endian machine")
	}
	return path, tok
}

// wantChanged fails unless err is a *ChangedError naming path and saying
// what happened.
func wantChanged(t *testing.T, what string, err error, path, detail string) {
	t.Helper()
	var ce *ChangedError
	if !errors.As(err, &ce) {
		t.Fatalf("%s after the file changed = %v, want a *ChangedError", what, err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "data: read "+path+": the file changed under the running job (") || !strings.Contains(msg, detail) {
		t.Errorf("%s: error %q, want it to name %s and say %q", what, msg, path, detail)
	}
}

// TestTruncatedFileIsAnError truncates a mapped token file: every read
// (sampler, eval batches, vocabulary check, Copy) returns a *ChangedError
// instead of faulting.
func TestTruncatedFileIsAnError(t *testing.T) {
	path, tok := mappedFile(t, 20000) // 40000 bytes: ten pages
	s, err := NewSampler(tok, SamplerConfig{Seed: 1, Batch: 4, Seq: 64, World: 1})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := EvalBatches(tok, 4, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	x, y := make([]int32, 4*64), make([]int32, 4*64)
	if err := s.Next(x, y); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 100); err != nil {
		t.Fatal(err)
	}
	const detail = "100 bytes now, 40000 when opened: truncated or rewritten in place"
	wantChanged(t, "Next", s.Next(x, y), path, detail)
	wantChanged(t, "Batch", ev.Batch(ev.Len()-1, x, y), path, detail)
	wantChanged(t, "CheckVocab", tok.CheckVocab(ByteVocabSize), path, detail)
	wantChanged(t, "Copy", tok.Copy(make([]uint16, 10), 19000), path, detail)
}

// TestRewrittenFileIsAnError rewrites a mapped token file in place with as
// many bytes: the size is the same, the modification time is not.
func TestRewrittenFileIsAnError(t *testing.T) {
	path, tok := mappedFile(t, 1000)
	if err := os.WriteFile(path, make([]byte, 2000), 0o644); err != nil {
		t.Fatal(err)
	}
	// The kernel's file clock is coarse: set a time that surely differs.
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	wantChanged(t, "Copy", tok.Copy(make([]uint16, 10), 0), path, "modified since it was opened: rewritten in place")
}

// sink keeps the compiler from dropping a read of the mapping.
var sink uint16

// TestFaultIsAnError truncates the file after the check before a read, as a
// truncation racing with the read would: the fault (SIGBUS) becomes a
// *ChangedError, and the goroutine's panic-on-fault setting is restored.
func TestFaultIsAnError(t *testing.T) {
	path, tok := mappedFile(t, 20000)
	if err := tok.begin(); err != nil {
		t.Fatal(err)
	}
	err := func() (err error) {
		defer tok.end(&err, debug.SetPanicOnFault(true))
		if err := os.Truncate(path, 0); err != nil {
			return err
		}
		sink = tok.toks[len(tok.toks)-1]
		return nil
	}()
	wantChanged(t, "a read of the mapping", err, path, "reading byte 39998 of 40000 faulted: truncated while being read")
	if debug.SetPanicOnFault(false) {
		t.Error("SetPanicOnFault is still on after the read")
	}
}

// TestOtherPanicsGoOn: end recovers faults in the mapping only.
func TestOtherPanicsGoOn(t *testing.T) {
	_, tok := mappedFile(t, 100)
	defer func() {
		if r := recover(); r != "boom" {
			t.Errorf("recovered %v, want the panic to go on", r)
		}
	}()
	func() (err error) {
		defer tok.end(&err, debug.SetPanicOnFault(true))
		panic("boom")
	}()
}

// TestTruncatedUnderProcess runs a rank-like process (this test binary)
// that maps a token file, which is then truncated, and draws a batch: it
// must fail with the one-line error, not die of SIGBUS with a stack dump.
func TestTruncatedUnderProcess(t *testing.T) {
	if path := os.Getenv("GTRAIN_DATA_TEST_TRUNCATE"); path != "" {
		truncatedChild(path)
		return
	}
	path, tok := mappedFile(t, 20000)
	tok.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTruncatedUnderProcess$")
	cmd.Env = append(os.Environ(), "GTRAIN_DATA_TEST_TRUNCATE="+path)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("child: %v, want exit code 3:\n%s", err, out)
	}
	if s := string(out); !strings.Contains(s, "data: read "+path+": the file changed under the running job") ||
		strings.Contains(s, "SIGBUS") || strings.Contains(s, "goroutine ") {
		t.Errorf("child's output, want the error and no Go runtime dump:\n%s", s)
	}
}

// truncatedChild is the process of TestTruncatedUnderProcess: it exits 3
// with the error of the batch drawn after the truncation.
func truncatedChild(path string) {
	tok, err := Open(path)
	if err == nil {
		var s *Sampler
		s, err = NewSampler(tok, SamplerConfig{Seed: 1, Batch: 4, Seq: 64, World: 1})
		if err == nil {
			err = os.Truncate(path, 0)
		}
		if err == nil {
			x, y := make([]int32, 4*64), make([]int32, 4*64)
			err = s.Next(x, y)
		}
	}
	if err == nil {
		os.Stderr.WriteString("no error after the truncation\n")
		os.Exit(1)
	}
	os.Stderr.WriteString(err.Error() + "\n")
	os.Exit(3)
}

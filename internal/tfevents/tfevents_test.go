package tfevents_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/tfevents"
	"github.com/gtrain/gtrain/internal/tfevents/tfeventstest"
)

// TestMaskedCRC: CRC-32C of "123456789" is 0xE3069283 (the check value of
// the Castagnoli polynomial), masked as TFRecord masks it.
func TestMaskedCRC(t *testing.T) {
	c := uint32(0xE3069283)
	want := (c>>15 | c<<17) + 0xa282ead8
	if got := tfevents.MaskedCRC([]byte("123456789")); got != want {
		t.Errorf("MaskedCRC = %#x, want %#x", got, want)
	}
}

// TestWriterReadByPython: what a Writer writes, Python's protobuf reads
// back (CRCs checked there): the file version first, then the events in
// order, scalars as simple values and text as a string tensor for the
// text plugin.
func TestWriterReadByPython(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tb")
	now := time.Unix(1700000000, 0)
	w, err := tfevents.Create(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(w.Path()), "events.out.tfevents.1700000000.") {
		t.Errorf("file name %s: want events.out.tfevents.<time>.<host>.<pid>.<n>", filepath.Base(w.Path()))
	}
	steps := []error{
		w.Text(0, 1.5, "job/text_summary", "hello ✓"),
		w.Scalars(1, 2.5, []tfevents.Scalar{{"train/loss", 4.25}, {"lr", 0.001}}),
		w.Restart(1, 3.5),
		w.Scalars(2, 4.5, []tfevents.Scalar{{"train/loss", 3.75}}),
		w.Close(),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	evs := tfeventstest.Read(t, w.Path())
	if len(evs) != 5 {
		t.Fatalf("%d events, want 5: %+v", len(evs), evs)
	}
	if evs[0].What != "file_version" || evs[0].FileVersion != tfevents.FileVersion || evs[0].WallTime != 1700000000 {
		t.Errorf("first event %+v, want file_version %q at the creation time", evs[0], tfevents.FileVersion)
	}
	text := evs[1].Values
	if len(text) != 1 || text[0].Tag != "job/text_summary" || text[0].Plugin != "text" || text[0].DType != "DT_STRING" ||
		len(text[0].Text) != 1 || text[0].Text[0] != "hello ✓" {
		t.Errorf("text event %+v", evs[1])
	}
	sc := evs[2].Values
	if evs[2].Step != 1 || evs[2].WallTime != 2.5 || len(sc) != 2 || sc[0].Tag != "train/loss" || *sc[0].SimpleValue != 4.25 || *sc[1].SimpleValue != 0.001 {
		t.Errorf("scalars event %+v", evs[2])
	}
	if evs[3].What != "session_log" || evs[3].SessionStatus != "START" || evs[3].Step != 1 {
		t.Errorf("restart event %+v, want a START session log at step 1", evs[3])
	}
}

// TestCreateRefusesFile: a log.tensorboard that is a file is an error
// naming it.
func TestCreateRefusesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "file")
	os.WriteFile(path, nil, 0o644)
	if _, err := tfevents.Create(path, time.Now()); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Create(%s) = %v, want an error naming it", path, err)
	}
}

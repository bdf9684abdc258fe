// Package tfeventstest reads TensorBoard event files in tests with an
// independent reader: Python's google.protobuf (Debian's python3-protobuf)
// on tbproto's .proto compiled by protoc (protobuf-compiler), with the
// record CRCs computed in Python.
package tfeventstest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gtrain/gtrain/internal/proctest"
)

// Value is one summary value: a scalar, or a text tensor.
type Value struct {
	Tag         string   `json:"tag"`
	SimpleValue *float32 `json:"simple_value"`
	Plugin      string   `json:"plugin"`
	DType       string   `json:"dtype"`
	Text        []string `json:"text"`
}

// Event is one decoded record.
type Event struct {
	File          string  `json:"file"`
	WallTime      float64 `json:"wall_time"`
	Step          int64   `json:"step"`
	What          string  `json:"what"` // file_version, summary or session_log
	FileVersion   string  `json:"file_version"`
	SessionStatus string  `json:"session_status"`
	Values        []Value `json:"values"`
}

// here is this package's directory.
func here() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Read decodes files, in order, failing t on a bad CRC or record. Without
// protoc or Python's google.protobuf it skips t, or fails it as
// proctest.Missing says (GTRAIN_REQUIRE_PROTOBUF).
func Read(t testing.TB, files ...string) []Event {
	t.Helper()
	gen := t.TempDir()
	proto := filepath.Join(here(), "..", "tbproto")
	if out, err := exec.Command("protoc", "-I", proto, "--python_out", gen, "tfevents.proto").CombinedOutput(); err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_PROTOBUF", fmt.Errorf("protoc --python_out (apt-get install protobuf-compiler): %v: %s", err, out))
	}
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import google.protobuf").CombinedOutput(); err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_PROTOBUF", fmt.Errorf("%s: import google.protobuf (apt-get install python3-protobuf): %v: %s", py, err, out))
	}
	args := append([]string{filepath.Join(here(), "read_tfevents.py"), gen}, files...)
	var stderr bytes.Buffer
	cmd := exec.Command(py, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("read_tfevents.py: %v\n%s", err, stderr.String())
	}
	var evs []Event
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("read_tfevents.py printed %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

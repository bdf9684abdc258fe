package proto

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	enc := NewEncoder(&buf)
	in := []Event{
		{V: Version, Type: EventLog, Rank: 3, Stream: "stdout", Line: "a <b> & \"c\"", Partial: true},
		{V: Version, Type: EventStatus, Rank: 0, Status: json.RawMessage(`{"step":1}`)},
		{V: Version, Type: EventRankExited, Rank: 1, Code: 137, Signal: "SIGKILL", Killed: true},
	}
	for _, ev := range in {
		if err := enc.Encode(ev); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Count(buf.String(), "\n") != len(in) {
		t.Fatalf("want one line per event:\n%s", buf.String())
	}
	dec := NewDecoder(&buf)
	for i, want := range in {
		var got Event
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if got.Type != want.Type || got.Line != want.Line || got.Code != want.Code || string(got.Status) != string(want.Status) {
			t.Errorf("event %d = %+v, want %+v", i, got, want)
		}
	}
	var ev Event
	if err := dec.Decode(&ev); !errors.Is(err, io.EOF) {
		t.Errorf("after last line: %v, want io.EOF", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct{ name, input, want string }{
		{"other version", `{"v":2,"type":"log"}`, "protocol version 2, want 1"},
		{"no version", `{"type":"log"}`, "protocol version 0"},
		{"not json", `hello`, "line 1"},
		{"too long", `{"v":1,"line":"` + strings.Repeat("x", MaxLine) + `"}`, "token too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ev Event
			err := NewDecoder(strings.NewReader(tt.input + "\n")).Decode(&ev)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

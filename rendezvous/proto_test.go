package rendezvous

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	nonce := `"` + strings.Repeat("A", 43) + `="` // base64 of 32 bytes
	tests := []struct {
		name, line string
		wantErr    error // nil: decodes
		wantMsg    string
	}{
		{"hello", `{"v":1,"type":"hello","nonce":` + nonce + `}`, nil, ""},
		{"set", `{"v":1,"type":"set","id":3,"key":"a/b","value":"aGk="}`, nil, ""},
		{"join", `{"v":1,"type":"join","id":1,"name":"w0","facts":{"cpus":4,"extra":[1]}}`, nil, ""},
		{"error", `{"v":1,"type":"error","code":"auth","error":"no"}`, nil, ""},
		{"unknown fields ignored", `{"v":1,"type":"welcome","later":true}`, nil, ""},
		{"not json", `hello`, ErrBadRequest, "malformed message"},
		{"array", `[1]`, ErrBadRequest, "malformed message"},
		{"no version", `{"type":"hello"}`, ErrVersion, "protocol version 0, want 1"},
		{"unknown type", `{"v":1,"type":"exec"}`, ErrBadRequest, `unknown message type "exec"`},
		{"value not base64", `{"v":1,"type":"set","id":1,"key":"k","value":"!!"}`, ErrBadRequest, "malformed message"},
		{"empty key", `{"v":1,"type":"get","id":1}`, ErrBadRequest, "empty key"},
		{"negative barrier", `{"v":1,"type":"barrier","id":1,"name":"b","n":-1}`, ErrBadRequest, "barrier of -1 clients"},
		{"facts null", `{"v":1,"type":"join","id":1,"name":"w0","facts":null}`, ErrBadRequest, "facts must be a JSON object"},
		{"port out of range", `{"v":1,"type":"join","id":1,"name":"w0","facts":{"master_port":70000}}`, ErrBadRequest, "master_port 70000"},
		{"control char in name", `{"v":1,"type":"join","id":1,"name":"w\u001b[2J","facts":{}}`, ErrBadRequest, "control character"},
		{"bad utf-8 in name", "{\"v\":1,\"type\":\"join\",\"id\":1,\"name\":\"w\xff\",\"facts\":{}}", ErrBadRequest, "control character"},
		{"mac too short", `{"v":1,"type":"auth","mac":"AAAA"}`, ErrBadRequest, "mac of 3 bytes, want 32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := decodeMessage([]byte(tt.line))
			if tt.wantErr == nil {
				if err != nil || m == nil {
					t.Fatalf("decode: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("decode error = %v, want %v with %q", err, tt.wantErr, tt.wantMsg)
			}
		})
	}
}

func TestReadLine(t *testing.T) {
	tests := []struct {
		name, input string
		max         int
		want        []string // lines, then the error text
	}{
		{"lines", "a\nbc\n", 2, []string{"a", "bc", "EOF"}},
		{"exactly max", "abcd\n", 4, []string{"abcd", "EOF"}},
		{"over max", "abcde\n", 4, []string{"line too long: over 4 bytes"}},
		{"no final newline", "ab", 4, []string{"unexpected EOF"}},
		{"long line over buffer", strings.Repeat("x", 5000) + "\n", 6000, []string{strings.Repeat("x", 5000), "EOF"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tt.input), 16)
			var got []string
			for {
				line, err := readLine(br, tt.max)
				if err != nil {
					got = append(got, err.Error())
					break
				}
				got = append(got, string(line))
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestErrorMessageRoundTrip(t *testing.T) {
	m := errorMessage(9, errorf(codeUnknown, "unknown node %q", "x"))
	b, err := encodeMessage(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeMessage(bytes.TrimSuffix(b, []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	if err := remoteError(back); !errors.Is(err, ErrUnknownNode) || err.Error() != `unknown node "x"` {
		t.Errorf("remote error = %v", err)
	}
}

// FuzzDecode feeds arbitrary lines to the decoder. It must never panic, and
// what it accepts must obey the limits and survive re-encoding unchanged.
// The seed corpus is in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := decodeMessage(line)
		if err != nil {
			var se *ServerError
			if !errors.As(err, &se) || se.Code == "" {
				t.Fatalf("error %v is not a *ServerError with a code", err)
			}
			return
		}
		if len(m.Key) > MaxKey || len(m.Value) > MaxValue || len(m.Old) > MaxValue || len(m.Facts) > MaxFacts {
			t.Fatalf("accepted a message over the limits: %q", line)
		}
		b1, err := encodeMessage(m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		m2, err := decodeMessage(bytes.TrimSuffix(b1, []byte("\n")))
		if err != nil {
			t.Fatalf("re-decode of %q: %v", b1, err)
		}
		b2, _ := encodeMessage(m2)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("not stable:\n%s\n%s", b1, b2)
		}
	})
}

package hostfiles

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Host
	}{
		{"long form", "worker-0 slots=8\n", []Host{{Name: "worker-0", Slots: 8, Line: 1}}},
		{"no trailing newline", "worker-0 slots=8", []Host{{Name: "worker-0", Slots: 8, Line: 1}}},
		{"short form", "worker-0:4", []Host{{Name: "worker-0", Slots: 4, Line: 1}}},
		{"short form with user", "alice@worker-0:4", []Host{{Name: "worker-0", User: "alice", Slots: 4, Line: 1}}},
		{"user", "alice@worker-0 slots=2", []Host{{Name: "worker-0", User: "alice", Slots: 2, Line: 1}}},
		{"port with slots", "worker-0:2222 slots=2", []Host{{Name: "worker-0", Port: 2222, Slots: 2, Line: 1}}},
		{"user and port", "bob@10.0.0.1:22 slots=1",
			[]Host{{Name: "10.0.0.1", User: "bob", Port: 22, Slots: 1, Line: 1}}},
		{"keys in any order", "w max_slots=8 slots=4", []Host{{Name: "w", Slots: 4, MaxSlots: 8, Line: 1}}},
		{"max_slots", "w slots=4 max_slots=4", []Host{{Name: "w", Slots: 4, MaxSlots: 4, Line: 1}}},
		{"max-slots synonym", "w slots=4 max-slots=6", []Host{{Name: "w", Slots: 4, MaxSlots: 6, Line: 1}}},
		{"comments and blanks", "# cluster\n\nworker-0 slots=8 # eight GPUs\n   \n#worker-1 slots=8\nworker-2 slots=8#x\n",
			[]Host{{Name: "worker-0", Slots: 8, Line: 3}, {Name: "worker-2", Slots: 8, Line: 6}}},
		{"tabs and spaces", "\t worker-0\t\tslots=8  \t\n",
			[]Host{{Name: "worker-0", Slots: 8, Line: 1}}},
		{"CRLF", "worker-0 slots=8\r\nworker-1:2\r\n\r\n",
			[]Host{{Name: "worker-0", Slots: 8, Line: 1}, {Name: "worker-1", Slots: 2, Line: 2}}},
		{"byte-order mark", "\uFEFFworker-0 slots=1", []Host{{Name: "worker-0", Slots: 1, Line: 1}}},
		{"leading zeros", "w:0022 slots=008", []Host{{Name: "w", Port: 22, Slots: 8, Line: 1}}},
		{"underscore and dots", "node_1.example.com slots=1", []Host{{Name: "node_1.example.com", Slots: 1, Line: 1}}},
		{"IPv6 bracketed with port", "[::1]:2222 slots=2", []Host{{Name: "::1", Port: 2222, Slots: 2, Line: 1}}},
		{"IPv6 bracketed", "[fe80::1] slots=2", []Host{{Name: "fe80::1", Slots: 2, Line: 1}}},
		{"IPv6 bracketed short form", "[::1]:4", []Host{{Name: "::1", Slots: 4, Line: 1}}},
		{"IPv6 bare", "::1 slots=2", []Host{{Name: "::1", Slots: 2, Line: 1}}},
		{"IPv6 bare with zone", "fe80::1%eth0 slots=2", []Host{{Name: "fe80::1%eth0", Slots: 2, Line: 1}}},
		{"IPv6 with user and port", "root@[2001:db8::7]:22 slots=1",
			[]Host{{Name: "2001:db8::7", User: "root", Port: 22, Slots: 1, Line: 1}}},
		{"IPv4-mapped IPv6", "::ffff:10.0.0.1 slots=1", []Host{{Name: "::ffff:10.0.0.1", Slots: 1, Line: 1}}},
		{"slot limit", "w slots=1024", []Host{{Name: "w", Slots: 1024, Line: 1}}},
		{"same user and port on two hosts", "u@a:22 slots=1\nu@b:22 slots=1",
			[]Host{{Name: "a", User: "u", Port: 22, Slots: 1, Line: 1}, {Name: "b", User: "u", Port: 22, Slots: 1, Line: 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("hosts.txt", strings.NewReader(tt.in))
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Parse(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		line int    // 0: whole-file error
		msg  string // substring of the message
	}{
		{"empty file", "", 0, "no hosts"},
		{"only comments", "# nothing\n\n  # here\n", 0, "no hosts"},
		{"duplicate", "worker-1 slots=1\nworker-0 slots=1\nworker-1 slots=2", 3,
			`duplicate host "worker-1" (first on line 1): remove one of the lines`},
		{"duplicate despite user and port", "a@w:22 slots=1\nb@w:23 slots=1", 2, `duplicate host "w"`},
		{"duplicate differing in case", "worker-0 slots=1\nWORKER-0 slots=1", 2, `(first on line 1 as "worker-0")`},
		{"duplicate IPv6 spellings", "[::1] slots=1\n0:0::1 slots=1", 2, `duplicate host "0:0::1"`},
		{"slots zero", "w slots=0", 1, `invalid slots= "0": want a whole number from 1 to 1024`},
		{"slots negative", "w slots=-1", 1, `invalid slots= "-1"`},
		{"slots plus sign", "w slots=+1", 1, `invalid slots= "+1"`},
		{"slots junk suffix", "w slots=2abc", 1, `invalid slots= "2abc"`},
		{"slots empty", "w slots=", 1, `invalid slots= ""`},
		{"slots too many", "w slots=1025", 1, `invalid slots= "1025": want a whole number from 1 to 1024`},
		{"too many hosts", manyHosts(MaxHosts+1, 1), MaxHosts + 1, "more than 65536 hosts, the most a hostfile may list"},
		{"too many slots", manyHosts(MaxFileSlots/MaxSlotsPerHost+1, MaxSlotsPerHost), MaxFileSlots/MaxSlotsPerHost + 1,
			"more than 1048576 slots in all"},
		{"file too large", strings.Repeat("#", MaxFileSize) + "\nw slots=1", 0, "larger than 4 MiB, the limit for a hostfile"},
		{"slots overflow", "w slots=99999999999999999999999", 1, `invalid slots=`},
		{"missing slots", "\nworker-0\n", 2, `missing slot count for "worker-0": add slots=N`},
		{"missing slots with max_slots", "w max_slots=4", 1, "missing slot count"},
		{"host:port without slots", "w:22 max_slots=4", 1, `missing slots= for "w:22"`},
		{"short form bad count", "w:x", 1, `invalid slot count in "w:x" "x"`},
		{"short form zero", "w:0", 1, `invalid slot count in "w:0" "0"`},
		{"short form empty", "w:", 1, `invalid slot count in "w:" ""`},
		{"unknown key", "w slots=1 gpus=4", 1, `unknown key "gpus": allowed keys are slots, max_slots (or max-slots)`},
		{"empty key", "w slots=1 =4", 1, `unknown key ""`},
		{"repeated slots", "w slots=1 slots=2", 1, "repeated key slots="},
		{"repeated max_slots", "w slots=1 max_slots=2 max-slots=2", 1, "repeated key max_slots="},
		{"max_slots below slots", "w slots=4 max_slots=2", 1, "max_slots=2 is less than slots=4"},
		{"max_slots zero", "w slots=4 max_slots=0", 1, `invalid max_slots= "0"`},
		{"max-slots junk", "w slots=4 max-slots=x", 1, `invalid max-slots= "x"`},
		{"port zero", "w:0 slots=1", 1, `invalid port "0": want a number from 1 to 65535`},
		{"port too big", "w:65536 slots=1", 1, `invalid port "65536"`},
		{"port not a number", "w:ssh slots=1", 1, `invalid port "ssh"`},
		{"port empty", "w: slots=1", 1, `invalid port ""`},
		{"junk field", "w slots=1 fast", 1, `unexpected field "fast": want key=value`},
		{"spaced key", "w slots = 1", 1, `unexpected field "slots"`},
		{"empty user", "@w slots=1", 1, `empty user in "@w"`},
		{"empty host after user", "u@ slots=1", 1, `empty host in "u@"`},
		{"two at signs", "u@v@w slots=1", 1, `more than one "@" in "u@v@w"`},
		{"bad user", "u;rm@w slots=1", 1, `invalid user "u;rm"`},
		{"dash user", "-oProxy@w slots=1", 1, `invalid user "-oProxy"`},
		{"bad host chars", "w/1 slots=1", 1, `invalid host name "w/1"`},
		{"dash host", "-oProxyCommand=x slots=1", 1, `invalid host name "-oProxyCommand=x"`},
		{"non-ASCII host", "wörker slots=1", 1, `invalid host name "wörker"`},
		{"empty host name", ":22 slots=1", 1, "empty host name"},
		{"host name too long", strings.Repeat("a", 254) + " slots=1", 1, "invalid host name"},
		{"bad IPv6", "a:b:c slots=1", 1, `invalid IPv6 address "a:b:c"`},
		{"IPv4 in brackets", "[10.0.0.1] slots=1", 1, `invalid IPv6 address "10.0.0.1"`},
		{"name in brackets", "[worker-0]:22 slots=1", 1, `invalid IPv6 address "worker-0"`},
		{"empty brackets", "[] slots=1", 1, `invalid IPv6 address ""`},
		{"unclosed bracket", "[::1 slots=1", 1, `missing "]" in "[::1"`},
		{"junk after bracket", "[::1]x slots=1", 1, `unexpected "x" after "]"`},
		{"bad zone", "[fe80::1%a]b] slots=1", 1, `unexpected "b]" after "]"`},
		{"bad zone chars", "fe80::1%a/b slots=1", 1, `invalid IPv6 zone "a/b"`},
		{"error after CRLF lines", "a slots=1\r\nb slots=x\r\n", 2, `invalid slots= "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("hosts.txt", strings.NewReader(tt.in))
			if err == nil {
				t.Fatalf("Parse(%q) succeeded, want error containing %q", tt.in, tt.msg)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(%q) error %v (%T) is not a *ParseError", tt.in, err, err)
			}
			if pe.File != "hosts.txt" || pe.Line != tt.line {
				t.Errorf("ParseError at %s:%d, want hosts.txt:%d", pe.File, pe.Line, tt.line)
			}
			prefix := "hostfiles: hosts.txt: "
			if tt.line > 0 {
				prefix = "hostfiles: hosts.txt:" + strconv.Itoa(tt.line) + ": "
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, prefix) || !strings.Contains(msg, tt.msg) || strings.Contains(msg, "\n") {
				t.Errorf("error = %q\nwant one line starting %q containing %q", msg, prefix, tt.msg)
			}
		})
	}
}

// manyHosts is a hostfile of n hosts with slots each.
func manyHosts(n, slots int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "h%d slots=%d\n", i, slots)
	}
	return b.String()
}

func TestParseReadError(t *testing.T) {
	boom := errors.New("boom")
	_, err := Parse("hosts.txt", iotest.ErrReader(boom))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "hosts.txt") {
		t.Errorf("Parse(failing reader) = %v, want an error naming hosts.txt wrapping %v", err, boom)
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	t.Run("ok", func(t *testing.T) {
		path := filepath.Join(dir, "hosts")
		if err := os.WriteFile(path, []byte("worker-0 slots=2\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadFile(t.Context(), path)
		if err != nil || len(got) != 1 || got[0].Name != "worker-0" {
			t.Errorf("ReadFile = %+v, %v", got, err)
		}
	})
	t.Run("error names path", func(t *testing.T) {
		path := filepath.Join(dir, "bad")
		if err := os.WriteFile(path, []byte("\nworker-0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ReadFile(t.Context(), path)
		var pe *ParseError
		if !errors.As(err, &pe) || pe.File != path || pe.Line != 2 {
			t.Errorf("ReadFile(%q) = %v, want *ParseError at %s:2", path, err, path)
		}
	})
	t.Run("missing", func(t *testing.T) {
		path := filepath.Join(dir, "missing")
		_, err := ReadFile(t.Context(), path)
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) ||
			!strings.HasPrefix(err.Error(), "hostfiles: ") {
			t.Errorf("ReadFile(%q) = %v, want a hostfiles error naming the path wrapping fs.ErrNotExist", path, err)
		}
	})
}

func TestAddr(t *testing.T) {
	tests := []struct {
		name string
		h    Host
		want string
	}{
		{"name", Host{Name: "worker-0"}, "worker-0"},
		{"name and port", Host{Name: "worker-0", Port: 2222}, "worker-0:2222"},
		{"user is not part of addr", Host{Name: "w", User: "u", Port: 22}, "w:22"},
		{"IPv6", Host{Name: "::1"}, "::1"},
		{"IPv6 and port", Host{Name: "::1", Port: 2222}, "[::1]:2222"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.h.Addr(); got != tt.want {
				t.Errorf("%+v.Addr() = %q, want %q", tt.h, got, tt.want)
			}
		})
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		name string
		h    Host
		want string
	}{
		{"plain", Host{Name: "w", Slots: 8}, "w slots=8"},
		{"everything", Host{Name: "w", User: "u", Port: 22, Slots: 4, MaxSlots: 8}, "u@w:22 slots=4 max_slots=8"},
		{"IPv6", Host{Name: "::1", Slots: 1}, "[::1] slots=1"},
		{"IPv6 and port", Host{Name: "fe80::1%eth0", Port: 22, Slots: 1}, "[fe80::1%eth0]:22 slots=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Format(tt.h)
			if got != tt.want {
				t.Fatalf("Format(%+v) = %q, want %q", tt.h, got, tt.want)
			}
			back, err := Parse("formatted", strings.NewReader(got))
			tt.h.Line = 1
			if err != nil || len(back) != 1 || back[0] != tt.h {
				t.Errorf("Parse(Format(h)) = %+v, %v; want %+v", back, err, tt.h)
			}
		})
	}
}

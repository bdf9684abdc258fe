package launch

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/gtrain/gtrain/internal/userfile"
)

// sparseFile is a file of size bytes that takes no room: the tests of the
// limits need files just over them, not the bytes.
func sparseFile(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

// within runs f, failing the test if it has not returned within a
// generous backstop: a read without a bound would never return.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}

// TestIdentityFileBounded: an --identity file over maxIdentityFile, or
// /dev/zero, is refused with a warning naming it and the limit instead of
// being read without end; the connection goes on with the other keys.
func TestIdentityFileBounded(t *testing.T) {
	for _, path := range []string{sparseFile(t, maxIdentityFile+1), "/dev/zero"} {
		var warned []string
		s := &SSH{Config: SSHConfig{Identities: []string{path}}, Warn: func(m string) { warned = append(warned, m) }}
		within(t, "authMethods", func() { s.authMethods(t.Context(), sshTarget{Identities: []string{path}}) })
		want := "ssh: identity " + path + ": larger than 1 MiB, the limit for this file"
		if len(warned) != 1 || !strings.Contains(warned[0], want) {
			t.Fatalf("warnings %q, want one saying %q", warned, want)
		}
		_, err := loadSigner(t.Context(), path)
		var ue *userfile.Error
		if !errors.As(err, &ue) || !errors.Is(err, userfile.ErrTooLarge) {
			t.Errorf("loadSigner(%s) = %v, want a *userfile.Error for a file too large", path, err)
		}
	}
}

// TestSSHConfigBounded: an ssh_config, or a file it includes, that is too
// large, endless, a FIFO or has a line long enough to stall the parser is
// ignored with a warning naming it and the limit, instead of being read
// (or parsed) without end; included files within the limits are read.
func TestSSHConfigBounded(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := sparseFile(t, maxSSHConfig+1)
	half := write("half", strings.Repeat("# "+strings.Repeat("x", 2000)+"\n", 1300)) // 2.5 MiB: over 4 MiB when included twice
	write("hosts", "Host trainer-*\n  HostName 127.0.0.9\n")
	tests := []struct {
		name, config, want string // want "" for a config that is read
	}{
		{"too large", big, big + ": larger than 4 MiB, the limit for this file"},
		{"endless", "/dev/zero", "/dev/zero: larger than 4 MiB, the limit for this file"},
		{"long line", write("long", "Host a\n  HostName "+strings.Repeat("h", 5000)+"\n"), "long:2: a line of more than 4 KiB, the limit for an ssh_config line"},
		{"include endless", write("inc-zero", "Include /dev/zero\n"), "inc-zero:1: Include: /dev/zero: not a regular file"},
		{"include fifo", write("inc-fifo", "Include = "+fifo+" # a comment\n"), "inc-fifo:1: Include: " + fifo + ": not a regular file"},
		{"include too large", write("inc-big", "include "+big+"\n"), "inc-big:1: Include " + big + ": with the files before it, over 4 MiB"},
		{"includes too large together", write("inc-twice", "Include "+half+" "+half+"\n"), "inc-twice:1: Include " + half + ": with the files before it, over 4 MiB"},
		{"nested include", write("inc-nested", "Include "+write("inc-inner", "\tInclude "+fifo+"\n")+"\n"), "inc-inner:1: Include: " + fifo + ": not a regular file"},
		{"include read", write("inc-ok", "Include "+filepath.Join(dir, "ho*s")+"\n"), ""},
		{"named and missing", filepath.Join(dir, "typo"), filepath.Join(dir, "typo") + ": no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var warned []string
			s := &SSH{Config: SSHConfig{ConfigFile: tt.config}, Warn: func(m string) { warned = append(warned, m) }}
			var tgt sshTarget
			within(t, "resolveTarget", func() { tgt = s.resolveTarget(t.Context(), Host{Name: "trainer-1"}, "u", 22) })
			if tt.want == "" {
				if len(warned) != 0 || tgt.HostName != "127.0.0.9" {
					t.Fatalf("resolved %+v, warnings %q; want the included file's HostName 127.0.0.9", tgt, warned)
				}
				return
			}
			if len(warned) != 1 || !strings.HasPrefix(warned[0], "ssh: ignoring "+tt.config+": ") || !strings.Contains(warned[0], tt.want) {
				t.Fatalf("warnings %q, want one ignoring %s and saying %q", warned, tt.config, tt.want)
			}
			if tgt.HostName != "trainer-1" {
				t.Errorf("resolved %+v from an ignored config", tgt)
			}
		})
	}
}

// TestIncludeArgs: Include lines are split as ssh_config splits them.
func TestIncludeArgs(t *testing.T) {
	for line, want := range map[string][]string{
		"Include a b":            {"a", "b"},
		"  include\ta #c":        {"a"},
		"INCLUDE=a":              {"a"},
		"Include = a  b\r":       {"a", "b"},
		"Include":                nil,
		"IncludeX a":             nil,
		"HostName include":       nil,
		"# Include /dev/zero":    nil,
		"Include a\tb # comment": {"a\tb"},
	} {
		got, _ := includeArgs(line)
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("includeArgs(%q) = %q, want %q", line, got, want)
		}
	}
}

// TestKnownHostsBounded: a known_hosts over maxKnownHosts, or /dev/zero,
// is refused naming it and the limit (a *userfile.Error: exit 2) instead of
// being read without end; one that is read is parsed from a private copy
// that is removed after, and its errors name the user's file; a missing
// one is skipped.
func TestKnownHostsBounded(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for _, path := range []string{sparseFile(t, maxKnownHosts+1), "/dev/zero"} {
		var err error
		within(t, "knownHostsCallback", func() { _, _, err = knownHostsCallback(t.Context(), []string{path}) })
		var ue *userfile.Error
		want := "ssh: read known_hosts: " + path + ": larger than 64 MiB, the limit for this file"
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), want) {
			t.Fatalf("known_hosts %s: %v, want a *userfile.Error saying %q", path, err, want)
		}
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("host1 ssh-ed25519 not-base64!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := knownHostsCallback(t.Context(), []string{filepath.Join(dir, "missing"), bad})
	if err == nil || !strings.Contains(err.Error(), "knownhosts: "+bad+":1: ") || strings.Contains(err.Error(), tmp) {
		t.Errorf("a broken known_hosts: %v, want an error naming %s:1 and not the copy", err, bad)
	}
	signer, _ := newKey(t)
	good := filepath.Join(dir, "good")
	line := knownhosts.Line([]string{knownhosts.Normalize("127.0.0.1:2222")}, signer.PublicKey())
	if err := os.WriteFile(good, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cb, read, err := knownHostsCallback(t.Context(), []string{filepath.Join(dir, "missing"), good})
	if err != nil || len(read) != 1 || read[0] != good {
		t.Fatalf("knownHostsCallback = %v, %v; want %s read", read, err, good)
	}
	if err := cb("127.0.0.1:2222", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2222}, signer.PublicKey()); err != nil {
		t.Errorf("the stored key is refused: %v", err)
	}
	if entries, err := os.ReadDir(tmp); err != nil || len(entries) != 0 {
		t.Errorf("TMPDIR holds %v (%v) after parsing: the copies must be removed", entries, err)
	}
	// Without a temporary directory the files themselves are parsed.
	t.Setenv("TMPDIR", filepath.Join(tmp, "missing"))
	if cb, _, err := knownHostsCallback(t.Context(), []string{good}); err != nil || cb == nil {
		t.Errorf("without TMPDIR: %v", err)
	}
}

// TestKnownHostsInterrupted: a known_hosts that is a FIFO nobody writes
// blocks its open; the dial's context still ends hostKeys.
func TestKnownHostsInterrupted(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "known_hosts")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var err error
	within(t, "hostKeys", func() {
		go cancel() // before or while hostKeys reads: either way it must return
		_, _, err = (&SSH{Config: SSHConfig{KnownHosts: []string{fifo}}}).hostKeys(ctx, sshTarget{HostName: "h", Port: 22})
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("hostKeys = %v, want the context's error", err)
	}
}

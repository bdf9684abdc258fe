package atomicfile

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// destCase is a destination to write: setup makes it in dir and returns the
// path to give Write; after checks what is there afterwards.
type destCase struct {
	name    string
	root    int // 1: run only as root, -1: only as non-root, 0: always
	setup   func(t *testing.T, dir string) string
	refused bool // Write must fail with *NotRegularError
	after   func(t *testing.T, dir string)
}

// TestWriteDestinations writes to each kind of destination: regular files
// (direct, through links, dangling links) are replaced or created, and
// every special file, directly or through a link, is refused and left as
// it was.
func TestWriteDestinations(t *testing.T) {
	cases := []destCase{
		{name: "regular", setup: file("out", "old"), after: isRegular("out", "new")},
		{name: "absent", setup: func(*testing.T, string) string { return "out" }, after: isRegular("out", "new")},
		{name: "symlink to regular", setup: link("out", "sub/real", file("sub/real", "old")),
			after: both(isLink("out", "sub/real"), isRegular("sub/real", "new"))},
		{name: "chain of symlinks", setup: link("out", "l2", link("l2", "sub/real", file("sub/real", "old"))),
			after: both(isLink("out", "l2"), isRegular("sub/real", "new"))},
		{name: "dangling symlink", setup: link("out", "sub/missing", mkdir("sub")),
			after: both(isLink("out", "sub/missing"), isRegular("sub/missing", "new"))},
		{name: "FIFO", setup: fifo("out"), refused: true, after: isMode("out", fs.ModeNamedPipe)},
		{name: "symlink to FIFO", setup: link("out", "p", fifo("p")), refused: true,
			after: both(isLink("out", "p"), isMode("p", fs.ModeNamedPipe))},
		{name: "char device", root: 1, setup: nullDevice("out"), refused: true, after: isMode("out", fs.ModeCharDevice)},
		{name: "symlink to char device", root: 1, setup: link("out", "null", nullDevice("null")), refused: true,
			after: both(isLink("out", "null"), isMode("null", fs.ModeCharDevice))},
		// Only where the write could not replace /dev/null even if refusing
		// it failed: a non-root user cannot create files in /dev.
		{name: "symlink to /dev/null", root: -1, setup: link("out", "/dev/null", nil), refused: true,
			after: func(t *testing.T, dir string) { isMode("/dev/null", fs.ModeCharDevice)(t, "") }},
		{name: "directory", setup: mkdir("out"), refused: true, after: isMode("out", fs.ModeDir)},
		{name: "socket", setup: socket("out"), refused: true, after: isMode("out", fs.ModeSocket)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root == 1 && os.Geteuid() != 0 {
				t.Skip("creating a device node needs root")
			}
			if c.root == -1 && os.Geteuid() == 0 {
				t.Skip("as root a failure would replace the real /dev/null")
			}
			dir := shortTempDir(t)
			path := filepath.Join(dir, c.setup(t, dir))
			err := Write(path, func(w io.Writer) error {
				_, err := io.WriteString(w, "new")
				return err
			})
			var nr *NotRegularError
			switch {
			case c.refused && !errors.As(err, &nr):
				t.Errorf("Write = %v, want a *NotRegularError", err)
			case c.refused && nr.Path != path:
				t.Errorf("error names %q, want %q: %v", nr.Path, path, err)
			case !c.refused && err != nil:
				t.Errorf("Write: %v", err)
			}
			c.after(t, dir)
			noTemps(t, dir)
		})
	}
}

// TestCommitChecksAgain replaces the destination with a FIFO between Create
// and Commit: the check right before the rename refuses it, and the FIFO
// stays.
func TestCommitChecksAgain(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out")
	a, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Abort()
	if _, err := io.WriteString(a, "new"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	var nr *NotRegularError
	if err := a.Commit(); !errors.As(err, &nr) {
		t.Fatalf("Commit = %v, want a *NotRegularError", err)
	}
	isMode("out", fs.ModeNamedPipe)(t, dir)
	noTemps(t, dir)
}

// TestErrorMessage checks the one line a user reads.
func TestErrorMessage(t *testing.T) {
	for _, c := range []struct {
		err  NotRegularError
		want string
	}{
		{NotRegularError{Path: "/dev/null", Target: "/dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice},
			"/dev/null is a character device, not a regular file: gtrain writes an output whole, renaming a new file into place, and replaces nothing but a regular file; name a new or regular file"},
		{NotRegularError{Path: "m.safetensors", Target: "p", Mode: fs.ModeNamedPipe},
			"m.safetensors links to p, a FIFO (named pipe), not a regular file: gtrain writes an output whole, renaming a new file into place, and replaces nothing but a regular file; name a new or regular file"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() =\n%s\nwant\n%s", got, c.want)
		}
	}
}

// TestPermissions: a new file is 0644 whatever the umask, a replaced one
// keeps its permissions.
func TestPermissions(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		old  fs.FileMode // 0: absent
		want fs.FileMode
	}{{"new", 0, 0o644}, {"private", 0o600, 0o600}, {"readonly", 0o444, 0o444}} {
		path := filepath.Join(dir, c.name)
		if c.old != 0 {
			if err := os.WriteFile(path, []byte("old"), c.old); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, c.old); err != nil {
				t.Fatal(err)
			}
		}
		if err := Write(path, func(w io.Writer) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != c.want {
			t.Errorf("%s: mode %v (%v), want %v", c.name, fi.Mode(), err, c.want)
		}
	}
}

// TestLinkLoop: a link to itself is an error, not a hang.
func TestLinkLoop(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "loop")
	if err := os.Symlink("loop", path); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, func(io.Writer) error { return nil }); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("Write = %v, want ELOOP", err)
	}
	isLink("loop", "loop")(t, dir)
}

// TestOpenAppend appends to a regular file through a link, and refuses a
// FIFO without blocking on it (it has no reader).
func TestOpenAppend(t *testing.T) {
	dir := t.TempDir()
	file("real", "a\n")(t, dir)
	link("kh", "real", nil)(t, dir)
	f, err := OpenAppend(filepath.Join(dir, "kh"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(f, "b\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	isRegular("real", "a\nb\n")(t, dir)
	fifo("p")(t, dir)
	var nr *NotRegularError
	if _, err := OpenAppend(filepath.Join(dir, "p"), 0o600); !errors.As(err, &nr) {
		t.Errorf("OpenAppend(FIFO) = %v, want a *NotRegularError", err)
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".rank-00000.safetensors" + TempMarker + "123": true,
		".manifest.json.tmp-9":                         true,
		"manifest.json":                                false,
		"step-00000100.tmp-1":                          false,
		".hidden":                                      false,
	} {
		if IsTemp(name) != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, !want, want)
		}
	}
}

// shortTempDir is a temporary directory with a path short enough for a
// unix socket in it (108 bytes on Linux).
func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "af")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type setupFunc = func(t *testing.T, dir string) string

func file(name, content string) setupFunc {
	return func(t *testing.T, dir string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return name
	}
}

func mkdir(name string) setupFunc {
	return func(t *testing.T, dir string) string {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		return name
	}
}

// link makes name a symbolic link to target (relative to name's directory
// unless absolute), after running then (if not nil) to make the target.
func link(name, target string, then setupFunc) setupFunc {
	return func(t *testing.T, dir string) string {
		if then != nil {
			then(t, dir)
		}
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		return name
	}
}

func fifo(name string) setupFunc {
	return func(t *testing.T, dir string) string {
		if err := syscall.Mkfifo(filepath.Join(dir, name), 0o644); err != nil {
			t.Fatal(err)
		}
		return name
	}
}

// nullDevice makes name a character device with /dev/null's numbers (1, 3),
// so that no test ever risks the real one.
func nullDevice(name string) setupFunc {
	return func(t *testing.T, dir string) string {
		if err := syscall.Mknod(filepath.Join(dir, name), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
			t.Fatal(err)
		}
		return name
	}
}

func socket(name string) setupFunc {
	return func(t *testing.T, dir string) string {
		l, err := net.Listen("unix", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		t.Cleanup(func() { l.Close() })
		return name
	}
}

func both(a, b func(*testing.T, string)) func(*testing.T, string) {
	return func(t *testing.T, dir string) { a(t, dir); b(t, dir) }
}

func isRegular(name, content string) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		p := filepath.Join(dir, name)
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s: %v, want a regular file", name, describe(fi, err))
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != content {
			t.Errorf("%s holds %q (%v), want %q", name, b, err, content)
		}
	}
}

func isLink(name, target string) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		if got, err := os.Readlink(filepath.Join(dir, name)); err != nil || got != target {
			t.Errorf("%s links to %q (%v), want it still a link to %q", name, got, err, target)
		}
	}
}

// isMode checks that name (absolute, or in dir) is still of type typ.
func isMode(name string, typ fs.FileMode) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, name)
		}
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&typ == 0 {
			t.Errorf("%s: %v, want it still %v", name, describe(fi, err), typ)
		}
	}
}

// describe is a file's mode, or the error of its Lstat.
func describe(fi fs.FileInfo, err error) string {
	if err != nil {
		return err.Error()
	}
	return fi.Mode().String()
}

// noTemps fails when a temporary file was left anywhere under dir.
func noTemps(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && IsTemp(d.Name()) {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

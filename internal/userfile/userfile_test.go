package userfile

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("worker-0 slots=8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := Read(context.Background(), small, 100)
	if err != nil || string(b) != "worker-0 slots=8\n" {
		t.Fatalf("Read = %q, %v", b, err)
	}
	// Exactly at the limit is fine, one byte over is not.
	if _, err := Read(context.Background(), small, int64(len(b))); err != nil {
		t.Errorf("Read at the limit: %v", err)
	}
	tests := []struct {
		name, path string
		want       error
		msg        string
	}{
		{"one byte over", small, ErrTooLarge, small + ": larger than 16 bytes, the limit for this file"},
		{"endless device", "/dev/zero", ErrTooLarge, "/dev/zero: larger than 16 bytes"},
		{"missing", filepath.Join(dir, "nope"), fs.ErrNotExist, "nope: no such file or directory"},
		{"directory", dir, syscall.EISDIR, dir + ": is a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(context.Background(), tt.path, 16)
			var ue *Error
			if !errors.As(err, &ue) || !errors.Is(err, tt.want) {
				t.Fatalf("Read(%s) = %v, want an *Error wrapping %v", tt.path, err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
		})
	}
}

// TestReadInterrupted: a FIFO nobody opens for writing blocks open(2) for
// ever; Read and Open still return the context's cause when it is cancelled.
func TestReadInterrupted(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	cause := errors.New("interrupted by test")
	for name, read := range map[string]func(context.Context) error{
		"Read": func(ctx context.Context) error { _, err := Read(ctx, fifo, ConfigLimit); return err },
		"Open": func(ctx context.Context) error { _, err := Open(ctx, fifo); return err },
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			done := make(chan error, 1)
			go func() { done <- read(ctx) }()
			cancel(cause)
			select {
			case err := <-done:
				if !errors.Is(err, cause) {
					t.Errorf("%s = %v, want the context's cause", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s of a FIFO without a writer did not return after cancel", name)
			}
		})
	}
}

// TestReadIOError: a read that fails after the open is an I/O error, not an
// *Error (which would make it the user's mistake).
func TestReadIOError(t *testing.T) {
	_, err := ReadAll(errReader{}, "f", 10)
	var ue *Error
	if errors.As(err, &ue) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("ReadAll = %v, want a plain error wrapping EIO", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, syscall.EIO }

func TestSize(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 bytes", 1000: "1000 bytes", 4 << 20: "4 MiB", 1536: "1.5 KiB", 3 << 30: "3 GiB",
	} {
		if got := Size(n); got != want {
			t.Errorf("Size(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestReadRegular: a regular file, or a link to one, is read up to its
// limit; a FIFO without a writer is refused at once instead of blocking the
// open, /dev/zero instead of being read without end.
func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	small, link, fifo := filepath.Join(dir, "small"), filepath.Join(dir, "link"), filepath.Join(dir, "fifo")
	if err := os.WriteFile(small, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("small", link); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	for _, p := range []string{small, link} {
		if b, err := ReadRegular(p, 10); err != nil || string(b) != "0123456789" {
			t.Errorf("ReadRegular(%s) = %q, %v", p, b, err)
		}
	}
	tests := []struct {
		name, path string
		want       error
		msg        string
	}{
		{"one byte over", small, ErrTooLarge, small + ": larger than 9 bytes, the limit for this file"},
		{"endless device", "/dev/zero", ErrNotRegular, "/dev/zero: not a regular file"},
		{"fifo without a writer", fifo, ErrNotRegular, fifo + ": not a regular file"},
		{"directory", dir, syscall.EISDIR, dir + ": is a directory"},
		{"missing", filepath.Join(dir, "nope"), fs.ErrNotExist, "nope: no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, err := ReadRegular(tt.path, 9); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second): // a backstop: the open must not block at all
				t.Fatalf("ReadRegular(%s) blocked", tt.path)
			}
			var ue *Error
			if !errors.As(err, &ue) || !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("ReadRegular(%s) = %v, want an *Error wrapping %v saying %q", tt.path, err, tt.want, tt.msg)
			}
		})
	}
}

// TestNames: only names with the prefix, at most maxNames of them, and at
// most maxScan names read to find them.
func TestNames(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a-1", "b-1", "a-2", "b-2", "a-3", "c"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	all := Names(dir, "a-", 100, 100)
	slices.Sort(all)
	if !slices.Equal(all, []string{"a-1", "a-2", "a-3"}) {
		t.Errorf("Names = %v, want a-1 a-2 a-3", all)
	}
	if got := Names(dir, "a-", 100, 2); len(got) != 2 {
		t.Errorf("maxNames 2: %v", got)
	}
	if got := Names(dir, "", 4, 100); len(got) != 4 {
		t.Errorf("maxScan 4 with every name wanted: %v, want 4", got)
	}
	if got := Names(filepath.Join(dir, "missing"), "", 100, 100); got != nil {
		t.Errorf("a missing directory: %v", got)
	}
}

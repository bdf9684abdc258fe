package usage

import (
	"errors"
	"io/fs"
	"testing"
)

func TestErrorf(t *testing.T) {
	err := Errorf("run: --hostfile %s: %w", "h.txt", fs.ErrNotExist)
	var u *Error
	if !errors.As(err, &u) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Errorf = %#v: want a *Error wrapping fs.ErrNotExist", err)
	}
	if got, want := err.Error(), "run: --hostfile h.txt: file does not exist"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}

func TestOneLine(t *testing.T) {
	err := errors.New("decoding failed:\n  * 'steps' expected an int\n  * 'seed'  is bad\n")
	if got, want := OneLine(err), "decoding failed:; * 'steps' expected an int; * 'seed' is bad;"; got != want {
		t.Errorf("OneLine = %q, want %q", got, want)
	}
}

// Package usage holds the one error type that says "the user asked for
// something gtrain cannot do as asked": a bad flag, argument, config key,
// filter or value. gtrain exits with code 2 for it (cmd/gtrain's ExitCode).
//
// It lives in internal/ rather than in the CLI so that every layer that
// checks what the user gave (the launcher, the engine's job checks, the
// planner's inputs) can say so without importing the command layer, and so
// that the exit code never depends on matching an error's text.
package usage

import (
	"fmt"
	"strings"
)

// Error marks Err as a usage error.
type Error struct{ Err error }

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Errorf formats like fmt.Errorf (%w included) and marks the result a usage
// error.
func Errorf(format string, a ...any) error {
	return &Error{Err: fmt.Errorf(format, a...)}
}

// OneLine is err's message on one line: a multi-line error (viper's and
// mapstructure's decode errors list one problem per line) joined with "; ",
// since gtrain reports every error in one line.
func OneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

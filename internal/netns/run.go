package netns

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// cmdTimeout bounds every helper command: ip and ssh-keygen finish in
// milliseconds, so a minute means something is wedged (e.g. a hung mount).
const cmdTimeout = time.Minute

// CmdError is a helper command that failed: it names the command line and
// carries its combined output, which is usually the only useful diagnosis.
type CmdError struct {
	Argv   []string
	Err    error
	Output string
}

func (e *CmdError) Error() string {
	out := strings.TrimSpace(e.Output)
	if out == "" {
		out = "(no output)"
	}
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Argv, " "), e.Err, out)
}

func (e *CmdError) Unwrap() error { return e.Err }

// run runs name with args and returns its stdout; on failure the error is a
// *CmdError with stdout and stderr.
func run(name string, args ...string) (string, error) {
	// Not the test's context: cleanup runs after t.Context is cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &CmdError{Argv: cmd.Args, Err: err, Output: stdout.String() + stderr.String()}
	}
	return stdout.String(), nil
}

// ip runs the ip(8) command.
func ip(args ...string) (string, error) { return run("ip", args...) }

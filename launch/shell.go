package launch

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// shellResult is what a shell command printed and its exit status.
type shellResult struct {
	stdout, stderr string
	code           int
}

// shellFunc runs a POSIX shell script on a host. The error is for a script
// that could not run to its end; an exit status is not an error.
type shellFunc func(ctx context.Context, script string) (shellResult, error)

// sshShell runs scripts in sessions of c. A script that outlives ctx is
// abandoned; closing c ends it.
func sshShell(c *ssh.Client) shellFunc {
	return func(ctx context.Context, script string) (shellResult, error) {
		type outcome struct {
			res shellResult
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			sess, err := c.NewSession() // may block on a dead connection
			if err != nil {
				done <- outcome{err: fmt.Errorf("open session: %w", err)}
				return
			}
			defer sess.Close()
			var out, errb strings.Builder
			sess.Stdout, sess.Stderr = &out, &errb
			err = sess.Run(script)
			res := shellResult{stdout: out.String(), stderr: errb.String()}
			var exit *ssh.ExitError
			if errors.As(err, &exit) && exit.Signal() == "" {
				res.code, err = exit.ExitStatus(), nil
			}
			done <- outcome{res, err}
		}()
		select {
		case o := <-done:
			return o.res, o.err
		case <-ctx.Done():
			return shellResult{}, context.Cause(ctx)
		}
	}
}

// localShell runs scripts on this machine.
func localShell(ctx context.Context, script string) (shellResult, error) {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = time.Second // a grandchild holding the pipes must not stall Wait
	err := cmd.Run()
	if ctx.Err() != nil {
		return shellResult{}, context.Cause(ctx)
	}
	res := shellResult{stdout: out.String(), stderr: errb.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.Exited() {
		res.code, err = exit.ExitCode(), nil
	}
	return res, err
}

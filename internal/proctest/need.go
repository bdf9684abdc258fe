package proctest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Missing skips t because something the test needs is not installed here;
// err says what, and how to install it. Where every dependency is promised
// it fails t instead, so that a broken CI image cannot turn a test tier
// silently green: under CI=true (or any value strconv.ParseBool reads as
// true), or with require, the dependency's own variable, set to 1 (make
// test sets GTRAIN_REQUIRE_TORCH=1 and GTRAIN_REQUIRE_NETNS=1).
func Missing(t testing.TB, require string, err error) {
	t.Helper()
	if required(require) {
		t.Fatalf("%v\n(required here: CI=true or %s=1)", err, require)
	} else {
		t.Skipf("%v\n(set %s=1 to fail instead)", err, require)
	}
}

// required reports whether the environment promises the dependency whose
// variable is require: CI is true, or require is 1.
func required(require string) bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci || os.Getenv(require) == "1"
}

// NeedTorch returns a Python interpreter that can import torch.distributed
// (Debian's python3-torch): /usr/bin/python3, else python3 on PATH. Without
// one it skips t, or fails it as Missing says (GTRAIN_REQUIRE_TORCH). The
// interpreters are tried once per test binary.
func NeedTorch(t testing.TB) string {
	t.Helper()
	py, err := torchPython()
	if err != nil {
		Missing(t, "GTRAIN_REQUIRE_TORCH", err)
	}
	return py
}

var torchPython = sync.OnceValues(findTorch)

// findTorch tries each candidate interpreter, saying why each failed.
func findTorch() (string, error) {
	var why []string
	for _, c := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(c)
		if err != nil {
			why = append(why, err.Error())
			continue
		}
		// A minute: importing torch on a busy machine takes seconds.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, path, "-c", "import torch.distributed").CombinedOutput()
		cancel()
		if err == nil {
			return path, nil
		}
		why = append(why, fmt.Sprintf("%s: import torch.distributed: %v: %s", path, err, lastLine(out)))
	}
	return "", errors.New("no Python with torch.distributed (apt-get install python3-torch):\n  " + strings.Join(why, "\n  "))
}

// lastLine is the last non-empty line of a command's output: a Python
// traceback ends with the error.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

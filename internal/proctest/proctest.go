// Package proctest helps tests that run real processes: it says whether
// what they need is installed (skipping the test, or failing it in CI), and
// checks what became of the processes.
package proctest

import (
	"os"
	"strconv"
	"strings"
)

// Alive reports whether pid is a running process: it exists and is not a
// zombie (a zombie has ended and only waits to be reaped).
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state letter follows the command name, which ends at the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// PrivateTMPDIR makes a temporary directory and sets TMPDIR to it, for
// this process (t.TempDir, os.MkdirTemp) and every process it starts, so
// that what those leave when a test kills them (an agent's directory with
// its store secret) goes when the caller, a TestMain, removes it.
func PrivateTMPDIR(prefix string) (string, error) {
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	return tmp, os.Setenv("TMPDIR", tmp)
}

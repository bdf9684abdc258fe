package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gtrain/gtrain/internal/proctest"
)

// scriptBinDir holds the gtrain binary the scripts run, built by TestMain.
var scriptBinDir string

// scriptVersion is stamped into the gtrain binary the scripts run, so that
// `gtrain version` has a known answer.
const scriptVersion = "v0.0.0-scripttest"

func init() {
	// Another test file of this package may already own -update (for its
	// golden files); package-level flag variables are initialised before any
	// init function runs, so share theirs rather than panic on a duplicate.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite golden files (the cmp targets of testdata/script) from actual output")
	}
}

// TestMain builds the real gtrain binary once for the script tests. It must be
// a real executable, not the test binary re-executed (testscript.RunMain):
// `gtrain run` starts `gtrain agent` from os.Executable(). Every process
// the tests start gets a temporary directory (TMPDIR) that the run
// removes: tests that SIGKILL agents would otherwise leave the agents'
// directories, each with a store secret, in the machine's /tmp.
func TestMain(m *testing.M) {
	flag.Parse()
	tmp, err := proctest.PrivateTMPDIR("gtrain-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "script_test:", err)
		os.Exit(1)
	}
	dir := filepath.Join(tmp, "bin")
	code := 1
	if err := os.Mkdir(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "script_test:", err)
	} else if err := buildGtrain(dir); err != nil {
		fmt.Fprintln(os.Stderr, "script_test:", err)
	} else {
		scriptBinDir = dir
		code = m.Run()
	}
	os.RemoveAll(tmp)
	os.Exit(code)
}

// buildGtrain builds this package into dir/gtrain with the test's own
// environment (GOFLAGS, GOCACHE, ...), without -race or coverage: it is the
// system under test, not the test.
func buildGtrain(dir string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("find go command: %w", err)
	}
	cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, "gtrain"),
		"-ldflags=-X main.version="+scriptVersion, ".")
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build gtrain: %w\n%s", err, out)
	}
	return nil
}

// TestScripts runs the CLI scripts in testdata/script against the built
// binary. Besides testscript's builtins they may use
//
//	exitcode N program [args...]
//
// which runs program like exec and fails unless it exits with code N.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                "testdata/script",
		UpdateScripts:      flag.Lookup("update").Value.(flag.Getter).Get().(bool),
		RequireUniqueNames: true,
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", scriptBinDir+string(os.PathListSeparator)+env.Getenv("PATH"))
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exitcode": cmdExitCode,
		},
		// [cpus2]: this process may run on two CPUs or more (NumCPU is its
		// affinity), as two ranks bound to cores of their own need.
		Condition: func(cond string) (bool, error) {
			if cond == "cpus2" {
				return runtime.NumCPU() >= 2, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
	})
}

// cmdExitCode implements `exitcode N program [args...]`. Its stdout and
// stderr are kept for the stdout and stderr commands that follow.
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode N program [args...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exitcode: bad code %q", args[0])
	}
	got := 0
	if err := ts.Exec(args[1], args[2:]...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("exitcode: %s: %v", args[1], err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited with code %d, want %d", args[1], got, want)
	}
}

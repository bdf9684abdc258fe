package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/internal/proctest"
)

// hostileMemLimitKiB is the virtual memory (ulimit -v) every hostile run
// gets. Go and glibc reserve address space generously (arenas, thread
// stacks), so this is well above what gtrain uses; it is far below what an
// unbounded allocation (a plan of 10^8 ranks, /dev/zero read to the end)
// reaches, which then fails at once instead of exhausting the machine.
const hostileMemLimitKiB = 3 << 20

// hostile is one hostile invocation of gtrain and what it must do.
type hostile struct {
	name  string
	args  []string
	stdin string // "": /dev/null; "silent": a pipe nobody ever writes to
	// interrupt, when set, is where gtrain must be blocked (a kernel wait
	// channel of one of its threads, "stdout:TEXT" for a line of its
	// output, "file:GLOB" for a file in its directory, or "fd:GLOB" for a
	// file it holds open: it is reading or writing it, or "setup" for the
	// moment setup's channel closes) when it gets SIGINT; it must then exit
	// 130 promptly.
	interrupt string
	signal    syscall.Signal // sent at interrupt; SIGINT when 0
	code      int
	stderr    string   // regexp the one line on stderr must match
	keep      []string // what the run may leave in its working directory
	notRoot   bool     // permissions mean nothing to root: skip as root
	skip      string   // a known bug outside this test's area, reported
	// setup, when set, runs in the run's directory before gtrain starts:
	// it makes what the case needs there (files it names go in keep) and
	// returns the arguments when they name what it made (a listener's
	// port; nil: args), and the channel "setup" interrupts at, or nil.
	setup func(t *testing.T, dir string) (args []string, ready <-chan struct{})
}

// Wait channels of a thread blocked on a user's input: open(2) of a FIFO
// without a writer, and Go's poller waiting for a pipe to have data.
const (
	inFIFOOpen = "wait_for_partner"
	inPipeRead = "do_epoll_wait"
)

// hostileCases tries every command with sizes and counts out of range,
// special files where text files are expected, and interrupts while it
// waits for input or runs.
func hostileCases() []hostile {
	const oneUsage = `^gtrain: .+`
	// Before any rank runs, gtrain was only reading or computing; once
	// ranks run, the job was stopped.
	interrupted := `^gtrain: interrupted by SIGINT$`
	jobStopped := `^gtrain: launch: interrupted by SIGINT: job stopped$`
	var cases []hostile
	add := func(cs ...hostile) { cases = append(cases, cs...) }

	// gtrain run: counts.
	add(
		hostile{name: "run nproc huge", args: []string{"run", "--nproc-per-node", "100000000", "--dry-run", "--", "true"}, code: 2,
			stderr: `^gtrain: run: --nproc-per-node 100000000: want 1 to 1024 ranks on this machine$`},
		hostile{name: "run nproc negative", args: []string{"run", "--nproc-per-node", "-1", "--", "true"}, code: 2, stderr: `--nproc-per-node -1: want 1 to 1024`},
		hostile{name: "run nproc overflow", args: []string{"run", "--nproc-per-node", "99999999999999999999", "--", "true"}, code: 2, stderr: `invalid argument "99999999999999999999" for "--nproc-per-node"`},
		hostile{name: "run max-restarts negative", args: []string{"run", "--max-restarts", "-5", "--", "true"}, code: 2, stderr: `--max-restarts -5`},
		hostile{name: "run master-port huge", args: []string{"run", "--master-port", "99999", "--", "true"}, code: 2, stderr: `--master-port 99999`},
		hostile{name: "run heartbeat tiny", args: []string{"run", "--heartbeat", "1ns", "--", "true"}, code: 2, stderr: `--heartbeat 1ns: must be at least 100ms`},
		hostile{name: "run grace negative", args: []string{"run", "--grace-period", "-1s", "--", "true"}, code: 2, stderr: `--grace-period -1s`},
		hostile{name: "run join-timeout negative", args: []string{"run", "--join-timeout", "-1s", "--", "true"}, code: 2, stderr: `--join-timeout -1s`},
		hostile{name: "run too many ranks in hostfile", args: []string{"run", "--hostfile", "wide", "--dry-run", "--", "true"}, code: 2,
			stderr: `66560 slots selected: a job has at most 65536 ranks`},
		hostile{name: "run slots huge", args: []string{"run", "--hostfile", "hugeslots", "--dry-run", "--", "true"}, code: 2, stderr: `hugeslots:1: invalid slots= "100000000": want a whole number from 1 to 1024`},
		hostile{name: "run env vars x ranks", args: []string{"run", "--hostfile", "max", "--env-file", "manyenv", "--dry-run", "--", "true"}, code: 2,
			stderr: `1024 variables from --env and --env-file for each of 65536 ranks: at most 64 per rank`},
		hostile{name: "run model layers huge", args: []string{"run", "--set", "model.layers=100000", "--dry-run"}, code: 2, stderr: oneUsage},
		hostile{name: "run model seq huge", args: []string{"run", "--set", "model.seq=100000", "--table", "never"}, code: 2, stderr: `needs about 9.4 TiB of memory per rank`},
		hostile{name: "run model seq huge dry run", args: []string{"run", "--set", "model.seq=100000", "--dry-run"}, code: 2, stderr: `needs about 9.4 TiB of memory per rank`},
	)
	// gtrain run: files that are not what they should be.
	for _, f := range []struct {
		flag string
		pre  []string
		post []string
	}{
		{"--hostfile", []string{"run"}, []string{"--dry-run", "--", "true"}},
		{"--env-file", []string{"run"}, []string{"--dry-run", "--", "true"}},
		{"--job", []string{"run"}, []string{"--dry-run"}},
		{"--config", []string{"run"}, []string{"--dry-run", "--", "true"}},
		{"--job", []string{"worker"}, nil},
		{"--topology", []string{"plan", "--params", "7B"}, nil},
		{"--hostfile", []string{"plan", "--params", "7B"}, nil},
		{"--hostfile", []string{"hosts", "check"}, nil},
		{"--hostfile", []string{"hosts", "topology"}, nil},
		{"--hostfile", []string{"plan", "--detect", "--model", "gpt2"}, nil},
	} {
		args := func(file string) []string { return slices.Concat(f.pre, []string{f.flag, file}, f.post) }
		what := strings.Join(f.pre, " ") + " " + f.flag
		add(
			hostile{name: what + " /dev/zero", args: args("/dev/zero"), code: 2, stderr: `/dev/zero: larger than .* the limit`},
			hostile{name: what + " /dev/urandom", args: args("/dev/urandom"), code: 2, stderr: `/dev/urandom: larger than .* the limit`},
			hostile{name: what + " symlink to /dev/zero", args: args("zero-link"), code: 2, stderr: `zero-link: larger than .* the limit`},
			hostile{name: what + " big file", args: args("big"), code: 2, stderr: `big: larger than 4 MiB, the limit`},
			hostile{name: what + " directory", args: args("adir"), code: 2, stderr: `adir: is a directory`},
			hostile{name: what + " dangling symlink", args: args("dangling"), code: 2, stderr: `dangling: no such file`},
			hostile{name: what + " symlink loop", args: args("loop"), code: 2, stderr: `loop: too many levels of symbolic links`},
			hostile{name: what + " unreadable", args: args("unreadable"), code: 2, stderr: `unreadable: permission denied`, notRoot: true},
			hostile{name: what + " FIFO without writer", args: args("fifo"), interrupt: inFIFOOpen, code: 130, stderr: interrupted},
			hostile{name: what + " silent stdin", args: args("/dev/stdin"), stdin: "silent", interrupt: inPipeRead, code: 130, stderr: interrupted},
		)
	}
	// gtrain resume, ckpt: a directory is expected.
	for _, cmd := range [][]string{{"resume"}, {"ckpt", "ls"}, {"ckpt", "verify"}, {"ckpt", "export", "--out", "out.safetensors"},
		{"generate"}, {"runs", "show"}} {
		what := strings.Join(cmd, " ")
		add(
			hostile{name: what + " /dev/zero", args: append(slices.Clone(cmd), "/dev/zero"), code: 2, stderr: oneUsage},
			hostile{name: what + " FIFO", args: append(slices.Clone(cmd), "fifo"), code: 2, stderr: oneUsage},
			hostile{name: what + " regular file", args: append(slices.Clone(cmd), "big"), code: 2, stderr: oneUsage},
			hostile{name: what + " missing", args: append(slices.Clone(cmd), "nope"), code: 2, stderr: `nope: no such`},
			hostile{name: what + " symlink loop", args: append(slices.Clone(cmd), "loop"), code: 2, stderr: `: loop: too many levels of symbolic links`},
		)
	}
	add(
		hostile{name: "ckpt verify empty dir", args: []string{"ckpt", "verify", "adir"}, code: 1, stderr: `no checkpoints in adir`},
		hostile{name: "ckpt ls missing argument", args: []string{"ckpt", "ls"}, code: 2, stderr: `^gtrain: ckpt ls: missing ROOT: usage: gtrain ckpt ls ROOT \[flags\]$`},
	)
	// Every command that verifies or exports a checkpoint reads all of it
	// (gigabytes for the larger models): interrupted while it reads or
	// writes, it stops at once and leaves no file behind.
	step := filepath.Join(bigCkpt, "step-00000001")
	reading := "fd:rank-00000.safetensors"
	add(
		hostile{name: "ckpt verify interrupted while hashing", args: []string{"ckpt", "verify", step}, interrupt: reading, code: 130, stderr: interrupted},
		hostile{name: "ckpt ls interrupted while hashing", args: []string{"ckpt", "ls", bigCkpt}, interrupt: reading, code: 130, stderr: interrupted},
		hostile{name: "ckpt export interrupted while verifying", args: []string{"ckpt", "export", bigCkpt, "--out", "out.safetensors"},
			interrupt: reading, code: 130, stderr: interrupted},
		hostile{name: "ckpt export interrupted while writing", args: []string{"ckpt", "export", step, "--out", "out.safetensors"},
			interrupt: "fd:.out.safetensors.tmp-*", code: 130, stderr: interrupted},
		hostile{name: "resume interrupted while verifying", args: []string{"resume", bigCkpt}, interrupt: reading, code: 130, stderr: interrupted},
		hostile{name: "generate interrupted while verifying", args: []string{"generate", bigCkpt}, interrupt: reading, code: 130, stderr: interrupted},
		hostile{name: "run into a used checkpoint.dir interrupted while verifying", args: []string{"run", "--set", "checkpoint.dir=" + bigCkpt},
			interrupt: reading, code: 130, stderr: interrupted},
	)
	// gtrain data prepare.
	add(
		hostile{name: "data synthetic huge", args: []string{"data", "prepare", "--synthetic", "99999999999999"}, code: 2,
			stderr: `^gtrain: data prepare: --synthetic 99999999999999: at most 1099511627776 tokens \(2 TiB of token files\)$`},
		hostile{name: "data synthetic beyond the disk", args: []string{"data", "prepare", "--synthetic", "1000000000000"}, code: 2,
			stderr: `^gtrain: data prepare: the tokens need 1.8 TiB \(2 bytes a token\) and data has .* free`, keep: []string{"data"}},
		hostile{name: "data synthetic negative", args: []string{"data", "prepare", "--synthetic", "-5"}, code: 2, stderr: `--synthetic -5: want at least 2 tokens`},
		hostile{name: "data val-fraction NaN", args: []string{"data", "prepare", "--val-fraction", "NaN", "big"}, code: 2, stderr: `--val-fraction NaN`},
		hostile{name: "data FIFO", args: []string{"data", "prepare", "fifo"}, code: 2, stderr: `^gtrain: data prepare: fifo: not a regular file or directory$`},
		hostile{name: "data /dev/zero", args: []string{"data", "prepare", "/dev/zero"}, code: 2, stderr: `/dev/zero: not a regular file`},
		hostile{name: "data symlink to /dev/zero", args: []string{"data", "prepare", "zero-link"}, code: 2, stderr: `zero-link: not a regular file`},
		hostile{name: "data empty directory", args: []string{"data", "prepare", "adir"}, code: 2, stderr: `adir: no .txt files`},
		hostile{name: "data out under a device", args: []string{"data", "prepare", "--synthetic", "100", "--out", "/dev/null/x"}, code: 1, stderr: `--out /dev/null/x`},
		hostile{name: "data interrupted while writing", args: []string{"data", "prepare", "--synthetic", "400000000", "--out", "slow"},
			interrupt: "file:slow/.train.bin*", code: 130, stderr: interrupted, keep: []string{"slow"}},
	)
	// gtrain plan: counts.
	add(
		hostile{name: "plan gpus huge", args: []string{"plan", "--params", "7B", "--gpus", "100000000"}, code: 2, stderr: `too large`},
		hostile{name: "plan gpus negative", args: []string{"plan", "--params", "7B", "--gpus", "-8"}, code: 2, stderr: `--gpus -8`},
		hostile{name: "plan layers huge", args: []string{"plan", "--gpus", "8", "--layers", "100000000", "--hidden", "1024", "--heads", "16"}, code: 2, stderr: `layers 100000000`},
		hostile{name: "plan params huge", args: []string{"plan", "--gpus", "8", "--params", "1e30"}, code: 2, stderr: `--params "1e30"`},
		hostile{name: "plan pins too many", args: []string{"plan", "--gpus", "8", "--params", "7B", "--micro-batch", intList(100)}, code: 2,
			stderr: `--micro-batch: 100 values: pin at most 64`},
		hostile{name: "plan top negative", args: []string{"plan", "--gpus", "8", "--params", "7B", "--top", "-1"}, code: 2, stderr: `--top -1`},
	)
	// gtrain hosts check, bench collectives, and no command at all.
	add(
		hostile{name: "hosts check no hostfile", args: []string{"hosts", "check"}, code: 2, stderr: `--hostfile is required`},
		hostile{name: "hosts check timeout negative", args: []string{"hosts", "check", "--hostfile", "hosts", "--ssh-timeout", "-1s"}, code: 2, stderr: `--ssh-timeout -1s`},
		hostile{name: "bench nproc huge", args: []string{"bench", "collectives", "--nproc-per-node", "100000000"}, code: 2, stderr: `--nproc-per-node 100000000`},
		hostile{name: "bench iters negative", args: []string{"bench", "collectives", "--iters", "-5"}, code: 2, stderr: oneUsage},
		hostile{name: "bench max-bytes huge", args: []string{"bench", "collectives", "--max-bytes", "1000000G"}, code: 2, stderr: oneUsage},
		hostile{name: "bench hostfile /dev/zero", args: []string{"bench", "collectives", "--hostfile", "/dev/zero"}, code: 2, stderr: `/dev/zero: larger than`},
		hostile{name: "unknown command", args: []string{"rnu"}, code: 2, stderr: `^gtrain: unknown command "rnu" for "gtrain": did you mean "run"\? \(see gtrain --help\)$`},
	)
	// SIGTERM while gtrain reads its input, before any rank runs.
	add(
		hostile{name: "run SIGTERM reading the hostfile", args: []string{"run", "--hostfile", "fifo", "--", "true"}, interrupt: inFIFOOpen,
			signal: syscall.SIGTERM, code: 143, stderr: `^gtrain: interrupted by SIGTERM$`},
		hostile{name: "worker SIGTERM reading its job", args: []string{"worker", "--job", "fifo"}, interrupt: inFIFOOpen,
			signal: syscall.SIGTERM, code: 143, stderr: `^gtrain: interrupted by SIGTERM$`},
	)
	// Interrupts once ranks run: the launch phase.
	add(
		hostile{name: "run interrupted while ranks run", args: []string{"run", "--nproc-per-node", "2", "--grace-period", "5s", "--", "sh", "-c", "echo up; exec sleep 300"},
			interrupt: "stdout:up", code: 130, stderr: jobStopped},
	)
	return append(cases, hostileNewCases()...)
}

func intList(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprint(i + 1)
	}
	return strings.Join(s, ",")
}

// TestHostileInputs runs the real gtrain binary on each hostile input, under
// a virtual memory limit, and checks that it answers with one clear line on
// stderr and the documented exit code, shows no Go runtime dump, and leaves
// nothing behind: no files in its working directory or TMPDIR, no process.
func TestHostileInputs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gtrain some hundred times")
	}
	bin := gtrainBin(t)
	cases := hostileCases()
	if len(cases) < 50 {
		t.Fatalf("only %d hostile cases", len(cases))
	}
	bigDir, big := t.TempDir(), ""
	for _, hc := range cases {
		t.Run(hc.name, func(t *testing.T) {
			switch {
			case hc.skip != "":
				t.Skip(hc.skip)
			case hc.notRoot && os.Geteuid() == 0:
				t.Skip("root may read any file")
			}
			if strings.Contains(strings.Join(hc.args, " "), bigCkpt) {
				if big == "" {
					big = makeBigCheckpoint(t, bigDir)
				}
				hc.args = slices.Clone(hc.args)
				for i, a := range hc.args {
					hc.args[i] = strings.ReplaceAll(a, bigCkpt, big)
				}
			}
			runHostile(t, bin, hc)
		})
	}
}

// bigCkpt, in a hostile case's arguments, stands for the root of a
// checkpoint large enough that reading it takes a while
// (makeBigCheckpoint), made once for all the cases.
const bigCkpt = "@big-checkpoint"

// bigCkptBytes is the size of that checkpoint: its one file is hashed a MiB
// at a time for a good fraction of a second, however fast the machine.
const bigCkptBytes = 512 << 20

// makeBigCheckpoint writes a valid checkpoint of step 1 under dir, one rank
// file of bigCkptBytes, and returns its root. Its tensors share one buffer,
// so that the test does not hold the whole checkpoint in memory.
func makeBigCheckpoint(t *testing.T, dir string) string {
	t.Helper()
	const tensors = 8
	buf := make([]float32, bigCkptBytes/4/tensors)
	for i := range buf {
		buf[i] = float32(i % 4099)
	}
	var shard []ckpt.Tensor
	for k := range tensors {
		shard = append(shard, ckpt.Tensor{Name: fmt.Sprintf("transformer.h.%d.mlp.c_fc.weight", k), Shape: []int{len(buf)}, Data: buf})
	}
	root := filepath.Join(dir, "ckpt")
	f, err := ckpt.WriteShard(root, 1, 0, shard, []byte(`{"step":1}`))
	if err != nil {
		t.Fatal(err)
	}
	m := ckpt.Manifest{Step: 1, Job: json.RawMessage(`{"steps":2}`), Layout: ckpt.Layout{World: 1, DP: 1, TP: 1, PP: 1}, Files: []ckpt.File{f}}
	if err := ckpt.Commit(root, m, 0, nil); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestHostileBaseline: a normal run of each kind passes under the same
// memory limit, so that the limit cannot be what fails a hostile case.
func TestHostileBaseline(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gtrain")
	}
	bin := gtrainBin(t)
	for _, args := range [][]string{
		{"run", "--nproc-per-node", "2", "--", "true"},
		{"run", "--nproc-per-node", "1024", "--dry-run", "--", "true"},
		// The most ranks (64 hosts of 1024 slots), their plan printed.
		{"run", "--hostfile", "max", "--dry-run", "--", "true"},
		{"run", "--hostfile", "max", "--dry-run", "-o", "json", "--", "true"},
		{"run", "--hostfile", "hosts", "--dry-run", "--", "true"},
		{"plan", "--params", "7B", "--gpus", "64"},
		{"data", "prepare", "--synthetic", "100000", "--out", "d"},
		{"hosts", "detect"},
		{"hosts", "topology", "-o", "json"},
		{"hosts", "topology", "--matrix"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := startHostile(t, bin, hostile{args: args})
			code, stdout, stderr := r.wait(t)
			if code != 0 || bytes.Contains(stderr, []byte("goroutine ")) {
				t.Fatalf("exit %d under ulimit -v %d KiB; stderr:\n%s\nstdout (end):\n%s", code, hostileMemLimitKiB, stderr, tail(stdout))
			}
		})
	}
}

// hostileRun is one started gtrain.
type hostileRun struct {
	cmd            *exec.Cmd
	dir, tmp, mark string
	stdout, stderr *bytes.Buffer
	outLines       chan string
	ready          <-chan struct{} // the case's setup's, for interrupt "setup"
	done           chan error
	silent         *os.File // write end of a silent stdin, held open
}

func startHostile(t *testing.T, bin string, hc hostile) *hostileRun {
	t.Helper()
	r := &hostileRun{dir: t.TempDir(), tmp: t.TempDir(), stdout: new(bytes.Buffer), stderr: new(bytes.Buffer),
		outLines: make(chan string, 1024), done: make(chan error, 1)}
	r.mark = fmt.Sprintf("GTRAIN_HOSTILE_MARK=%d-%d", os.Getpid(), time.Now().UnixNano())
	makeHostileFiles(t, r.dir)
	if hc.setup != nil {
		var args []string
		if args, r.ready = hc.setup(t, r.dir); args != nil {
			hc.args = args
		}
	}
	// exec keeps the pid: the shell only sets the limit.
	script := fmt.Sprintf(`ulimit -v %d && exec "$0" "$@"`, hostileMemLimitKiB)
	r.cmd = exec.Command("sh", append([]string{"-c", script, bin}, hc.args...)...)
	r.cmd.Dir = r.dir
	r.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + r.dir, "TMPDIR=" + r.tmp, "NO_COLOR=1",
		"MALLOC_ARENA_MAX=2", r.mark}
	r.cmd.Stderr = r.stderr
	if hc.stdin == "silent" {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r.cmd.Stdin, r.silent = pr, pw
		t.Cleanup(func() { pr.Close(); pw.Close() })
	}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.cmd.Process.Kill() })
	go func() {
		br := bufio.NewReader(out)
		for {
			line, err := br.ReadString('\n')
			if r.stdout.Len() < 1<<20 { // a plan of the most ranks is 300 MB
				r.stdout.WriteString(line)
			}
			select {
			case r.outLines <- line:
			default:
			}
			if err != nil {
				break
			}
		}
		r.done <- r.cmd.Wait()
	}()
	return r
}

// wait returns the exit code (128+n when killed by signal n: that is a
// failure of gtrain's own signal handling when it should have exited) and
// the output.
func (r *hostileRun) wait(t *testing.T) (int, []byte, []byte) {
	t.Helper()
	select {
	case err := <-r.done:
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Errorf("gtrain was killed by %v instead of exiting", ws.Signal())
				code = 128 + int(ws.Signal())
			}
		} else if err != nil {
			t.Fatal(err)
		}
		return code, r.stdout.Bytes(), r.stderr.Bytes()
	case <-time.After(60 * time.Second):
		t.Fatalf("gtrain did not exit within 60s; stderr so far:\n%s", r.stderr)
		return 0, nil, nil
	}
}

func runHostile(t *testing.T, bin string, hc hostile) {
	r := startHostile(t, bin, hc)
	if hc.interrupt != "" {
		r.awaitPhase(t, hc.interrupt)
		sig := cmp.Or(hc.signal, syscall.SIGINT)
		if glob, ok := strings.CutPrefix(hc.interrupt, "fd:"); ok {
			r.signalHolding(t, glob, sig)
		} else if err := r.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	code, stdout, stderr := r.wait(t)
	if hc.interrupt != "" && time.Since(start) > 20*time.Second {
		t.Errorf("gtrain took %v to stop after SIGINT", time.Since(start).Round(time.Millisecond))
	}
	t.Logf("exit %d in %v: %s", code, time.Since(start).Round(time.Millisecond), bytes.TrimSpace(stderr))
	all := string(stdout) + string(stderr)
	for _, dump := range []string{"goroutine ", "panic:", "fatal error:", "SIGSEGV", "SIGABRT"} {
		if strings.Contains(all, dump) {
			t.Fatalf("Go runtime dump (%q) in the output; stderr:\n%s", dump, tail(stderr))
		}
	}
	if code != hc.code {
		t.Errorf("exit code %d, want %d", code, hc.code)
	}
	lines := strings.Split(strings.TrimSuffix(string(stderr), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "gtrain: ") || !regexp.MustCompile(hc.stderr).MatchString(lines[0]) {
		t.Errorf("stderr:\n%s\nwant one line starting \"gtrain: \" matching %q", stderr, hc.stderr)
	}
	r.checkNothingLeft(t, hc.keep)
}

// awaitPhase waits until gtrain is where the case interrupts it: one of its
// threads in the kernel wait channel phase, a line of stdout starting with
// TEXT ("stdout:TEXT"), or a file matching a glob in its directory
// ("file:GLOB").
func (r *hostileRun) awaitPhase(t *testing.T, phase string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	if text, ok := strings.CutPrefix(phase, "stdout:"); ok {
		for {
			select {
			case line := <-r.outLines:
				if strings.HasPrefix(strings.TrimPrefix(line, "[rank 0] "), text) || strings.Contains(line, "] "+text) {
					return
				}
			case <-deadline:
				t.Fatalf("no %q on stdout within 30s; stderr:\n%s", text, r.stderr)
			}
		}
	}
	if phase == "setup" {
		select {
		case <-r.ready:
			return
		case <-deadline:
			t.Fatalf("gtrain not at the case's interrupt point within 30s; stderr:\n%s", r.stderr)
		case err := <-r.done:
			r.done <- err
			t.Fatalf("gtrain exited before reaching the case's interrupt point; stderr:\n%s", r.stderr)
		}
	}
	pid := r.cmd.Process.Pid
	var seen []string
	for {
		if glob, ok := strings.CutPrefix(phase, "file:"); ok {
			if m, _ := filepath.Glob(filepath.Join(r.dir, glob)); len(m) > 0 {
				return
			}
		} else if glob, ok := strings.CutPrefix(phase, "fd:"); ok {
			if holdsOpen(pid, glob) {
				return
			}
		} else {
			seen = wchans(pid)
			if slices.Contains(seen, phase) {
				return
			}
		}
		select {
		case <-deadline:
			t.Fatalf("gtrain (pid %d) not in %s within 30s (threads in %v); stderr:\n%s", pid, phase, seen, r.stderr)
		case err := <-r.done:
			r.done <- err
			t.Fatalf("gtrain exited before reaching %s; stderr:\n%s", phase, r.stderr)
		case <-time.After(10 * time.Millisecond): // polling /proc
		}
	}
}

// signalHolding sends sig to gtrain while it holds a file matching glob
// open, however loaded the machine: it stops gtrain (SIGSTOP), checks that
// the file is still open, sends sig and lets gtrain go on (SIGCONT), which
// then finds sig pending before it can read much further.
func (r *hostileRun) signalHolding(t *testing.T, glob string, sig syscall.Signal) {
	t.Helper()
	p := r.cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for !allStopped(p.Pid) {
		select {
		case <-deadline:
			t.Fatalf("gtrain (pid %d) not stopped 30s after SIGSTOP", p.Pid)
		case err := <-r.done:
			r.done <- err
			t.Fatalf("gtrain exited before it could be interrupted reading %s: the work is too short; stderr:\n%s", glob, r.stderr)
		case <-time.After(time.Millisecond): // polling /proc
		}
	}
	held := holdsOpen(p.Pid, glob)
	if held {
		if err := p.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !held {
		t.Fatalf("gtrain closed %s before it was stopped: the work is too short to interrupt", glob)
	}
}

// allStopped reports whether every thread of pid is stopped by a signal.
func allStopped(pid int) bool {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	for _, f := range stats {
		b, err := os.ReadFile(f)
		// The state follows the command name, which is in parentheses.
		i := bytes.LastIndexByte(b, ')')
		if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return len(stats) > 0
}

// holdsOpen reports whether pid has a file whose name matches glob open.
func holdsOpen(pid int, glob string) bool {
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil {
			if ok, _ := filepath.Match(glob, filepath.Base(target)); ok {
				return true
			}
		}
	}
	return false
}

// wchans are the kernel wait channels of pid's threads.
func wchans(pid int) []string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
	var out []string
	for _, f := range tasks {
		if b, err := os.ReadFile(f); err == nil {
			out = append(out, string(b))
		}
	}
	return out
}

// checkNothingLeft fails when the run left files in its working directory
// (other than the fixtures and keep) or TMPDIR, or a process behind.
func (r *hostileRun) checkNothingLeft(t *testing.T, keep []string) {
	t.Helper()
	want := append(slices.Clone(hostileFixtures), keep...)
	entries, _ := os.ReadDir(r.dir)
	for _, e := range entries {
		if !slices.Contains(want, e.Name()) {
			t.Errorf("left %s in its working directory", e.Name())
		}
	}
	if entries, _ := os.ReadDir(r.tmp); len(entries) > 0 {
		t.Errorf("left %d entries in TMPDIR, e.g. %s", len(entries), entries[0].Name())
	}
	for _, k := range keep {
		filepath.WalkDir(filepath.Join(r.dir, k), func(path string, d os.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), ".") {
				t.Errorf("left a temporary file %s", path)
			}
			return nil
		})
	}
	// Processes of the job end asynchronously after gtrain itself.
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := marked(r.mark)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes left running: %v", left)
			return
		}
		time.Sleep(50 * time.Millisecond) // polling /proc
	}
}

// marked are the live processes whose environment holds mark.
func marked(mark string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/environ")
	var pids []int
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte(mark+"\x00")) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(f, "/proc/%d/environ", &pid); err == nil && proctest.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// hostileFixtures are the files every hostile run finds in its directory.
var hostileFixtures = []string{"fifo", "big", "adir", "zero-link", "dangling", "loop", "unreadable",
	"hosts", "wide", "max", "hugeslots", "manyenv"}

func makeHostileFiles(t *testing.T, dir string) {
	t.Helper()
	p := func(name string) string { return filepath.Join(dir, name) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(syscall.Mkfifo(p("fifo"), 0o600))
	f, err := os.Create(p("big"))
	must(err)
	must(f.Truncate(5 << 20)) // sparse: 5 MiB of zeros
	must(f.Close())
	must(os.Mkdir(p("adir"), 0o755))
	must(os.Symlink("/dev/zero", p("zero-link")))
	must(os.Symlink("no-such-file", p("dangling")))
	must(os.Symlink("loop", p("loop")))
	must(os.WriteFile(p("unreadable"), []byte("x slots=1\n"), 0))
	must(os.WriteFile(p("hosts"), []byte("localhost slots=2\n"), 0o644))
	var wide strings.Builder
	for i := range 65 {
		fmt.Fprintf(&wide, "h%d slots=1024\n", i)
	}
	must(os.WriteFile(p("max"), []byte(strings.Join(strings.SplitAfter(wide.String(), "\n")[:64], "")), 0o644))
	must(os.WriteFile(p("wide"), []byte(wide.String()), 0o644))
	must(os.WriteFile(p("hugeslots"), []byte("h0 slots=100000000\n"), 0o644))
	var env strings.Builder
	for i := range 1024 {
		fmt.Fprintf(&env, "V%d=%d\n", i, i)
	}
	must(os.WriteFile(p("manyenv"), []byte(env.String()), 0o644))
}

func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

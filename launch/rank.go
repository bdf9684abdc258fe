package launch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/launch/proto"
)

// StatusFD is the file descriptor on which a rank may write JSON status
// records, one object per line, when the job asks for a status channel. Its
// number is also given to the rank as GTRAIN_STATUS_FD.
const StatusFD = 3

// drainTimeout bounds how long output is still read after a rank's process
// has exited: a descendant that escaped teardown may hold the pipe open.
const drainTimeout = 2 * time.Second

// rankProc is one running rank.
type rankProc struct {
	asg     proto.RankAssignment
	pid     int
	errFile string
	exited  atomic.Bool   // the process has been reaped
	signals atomic.Uint64 // bit n set: teardown sent it signal n
	done    chan struct{}
}

// sent records that teardown sent the rank sig.
func (rp *rankProc) sent(sig syscall.Signal) {
	if sig > 0 && sig < 64 {
		rp.signals.Or(1 << sig)
	}
}

// killedBy says whether the rank's end was gtrain's doing: teardown had
// signalled it, and if a signal ended it, it was one teardown sent. A rank
// that the OOM killer (or anyone else) SIGKILLed while teardown's SIGTERM
// was on its way is not ours: it is a failure to report.
func (rp *rankProc) killedBy(signum int) bool {
	sent := rp.signals.Load()
	if sent == 0 {
		return false
	}
	return signum <= 0 || signum >= 64 || sent&(1<<signum) != 0
}

// start launches one rank and returns at once; rp.done closes after its
// rank_exited event has been written. A rank that cannot start is reported as
// exited with code 127, as a shell would, so the launcher tears the job down.
func (a *agent) start(rs proto.RankAssignment) *rankProc {
	rp := &rankProc{asg: rs, done: make(chan struct{})}
	a.mu.Lock()
	a.ranks = append(a.ranks, rp)
	a.mu.Unlock()
	readers, err := a.spawn(rp)
	if err != nil {
		// The rank_exited event carries the reason; the launcher reports it once.
		a.exited(rp, 127, "", errorFile{Message: err.Error()}, time.Now())
		return rp
	}
	a.emit(proto.Event{Type: proto.EventRankStarted, Rank: rs.Rank, Local: rs.LocalRank, PID: rp.pid})
	go a.wait(rp, readers)
	return rp
}

// rankIO is the parent's side of a rank's pipes plus the child's process.
type rankIO struct {
	cmd     *exec.Cmd
	pipes   []*os.File // read ends
	readers sync.WaitGroup
}

// spawn starts the rank's process with its pipes and environment.
func (a *agent) spawn(rp *rankProc) (*rankIO, error) {
	rs := rp.asg
	env := mergeEnv(withoutVars(os.Environ(), a.asg.Unset), a.asg.Env, rs.Env, a.startEnv, a.storeEnv)
	if a.tmpdir != "" && a.asg.ErrorFiles {
		dir := filepath.Join(a.tmpdir, "attempt-"+strconv.Itoa(a.asg.Attempt), "rank-"+strconv.Itoa(rs.Rank))
		if err := os.MkdirAll(dir, 0o700); err == nil {
			rp.errFile = filepath.Join(dir, "error.json")
			env = mergeEnv(env, []string{rankenv.ErrorFile + "=" + rp.errFile})
		}
	}
	cmd := exec.Command(rankProgram(a.asg.Command[0]), a.asg.Command[1:]...)
	cmd.Dir = rankDir(a.asg.Dir)
	cmd.SysProcAttr = rankAttr()
	var parentEnds, childEnds []*os.File
	closeAll := func() {
		for _, f := range append(parentEnds, childEnds...) {
			f.Close()
		}
	}
	n := 2
	if a.asg.StatusFD {
		n = 3
		env = mergeEnv(env, []string{rankenv.StatusFD + "=" + strconv.Itoa(StatusFD)})
	}
	for range n {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("pipe: %w", err)
		}
		parentEnds, childEnds = append(parentEnds, r), append(childEnds, w)
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = childEnds[0], childEnds[1]
	if a.asg.StatusFD {
		cmd.ExtraFiles = []*os.File{childEnds[2]}
	}
	b := a.binds[rs.LocalRank]
	if b != nil {
		cmd.Env = withDefaults(cmd.Env, b.Env)
	}
	if err := startBound(cmd, b, func(msg string) { a.rankWarning(rs, msg) }, rp.done); err != nil {
		closeAll()
		return nil, fmt.Errorf("start %s: %w", a.asg.Command[0], err)
	}
	for _, f := range childEnds {
		f.Close()
	}
	rp.pid = cmd.Process.Pid
	rio := &rankIO{cmd: cmd, pipes: parentEnds}
	rio.readers.Add(len(parentEnds))
	go a.readLines(rp, parentEnds[0], "stdout", &rio.readers)
	go a.readLines(rp, parentEnds[1], "stderr", &rio.readers)
	if a.asg.StatusFD {
		go a.readStatus(rp, parentEnds[2], &rio.readers)
	}
	return rio, nil
}

// rankWarning reports a problem of rank rs that does not stop it.
func (a *agent) rankWarning(rs proto.RankAssignment, msg string) {
	a.emit(proto.Event{Type: proto.EventError, Rank: rs.Rank, Local: rs.LocalRank, Message: fmt.Sprintf("rank %d: %s", rs.Rank, msg)})
}

// wait reaps the rank, lets its output drain, and reports its exit.
func (a *agent) wait(rp *rankProc, rio *rankIO) {
	_ = rio.cmd.Wait() // the exit status is read from ProcessState below
	rp.exited.Store(true)
	end := time.Now()
	drained := make(chan struct{})
	go func() { rio.readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		for _, f := range rio.pipes {
			_ = f.SetReadDeadline(time.Now())
		}
		<-drained
	}
	for _, f := range rio.pipes {
		f.Close()
	}
	code, sig := exitStatus(rio.cmd.ProcessState)
	var ef errorFile
	if code != 0 {
		ef = readErrorFile(rp.errFile)
	}
	a.exited(rp, code, sig, ef, end)
}

// rankDir is the Dir for a rank's exec.Cmd: "" (inherit) when dir is where
// the agent already is, because os/exec adds PWD to the environment of a
// command given a Dir, and a rank should see exactly the environment torchrun
// would give it.
func rankDir(dir string) string {
	if dir == "" {
		return ""
	}
	if wd, err := os.Getwd(); err == nil && filepath.Clean(wd) == filepath.Clean(dir) {
		return ""
	}
	return dir
}

// exited reports a rank's end, at time end, and marks it done.
func (a *agent) exited(rp *rankProc, code int, sig string, ef errorFile, end time.Time) {
	rp.exited.Store(true)
	signum := 0
	if sig != "" {
		signum = code - 128
	}
	a.emit(proto.Event{
		Type: proto.EventRankExited, Time: end, Rank: rp.asg.Rank, Local: rp.asg.LocalRank,
		PID: rp.pid, Code: code, Signal: sig, Killed: rp.killedBy(signum), Message: ef.Message, PeerFailed: ef.PeerFailed,
	})
	close(rp.done)
}

// exitStatus returns the shell-style exit code (128+n for signal n) and the
// signal's name, if a signal ended the process.
func exitStatus(ps *os.ProcessState) (int, string) {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return ps.ExitCode(), ""
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal()), unix.SignalName(ws.Signal())
	}
	return ws.ExitStatus(), ""
}

// readLines turns a rank's output into log events, one per line. A line
// longer than proto.MaxLogLine is sent in pieces marked partial, and so is a
// last line that lacks its newline.
func (a *agent) readLines(rp *rankProc, r io.Reader, stream string, wg *sync.WaitGroup) {
	defer wg.Done()
	br := bufio.NewReaderSize(r, proto.MaxLogLine)
	for {
		b, err := br.ReadSlice('\n')
		if len(b) > 0 {
			full := err == nil
			line := string(bytes.TrimSuffix(b, []byte("\n")))
			a.emit(proto.Event{Type: proto.EventLog, Rank: rp.asg.Rank, Local: rp.asg.LocalRank,
				Stream: stream, Line: line, Partial: !full})
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// readStatus forwards the rank's status records. A record that is not a JSON
// object is reported once as an error and otherwise ignored. A record longer
// than proto.MaxLogLine is dropped with an error naming its size, and the
// channel goes on: memory stays bounded by the reader's buffer.
func (a *agent) readStatus(rp *rankProc, r io.Reader, wg *sync.WaitGroup) {
	defer wg.Done()
	br := bufio.NewReaderSize(r, proto.MaxLogLine)
	warned := false
	for {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			n, end := skipLine(br)
			if end == nil {
				n-- // the newline is not part of the record
			}
			a.oversizedStatus(rp, len(b)+n, end)
			if end != nil {
				return
			}
			continue
		}
		if b = bytes.TrimSpace(b); len(b) > 0 {
			if b[0] != '{' || !json.Valid(b) {
				if !warned {
					warned = true
					a.emit(proto.Event{Type: proto.EventError, Rank: rp.asg.Rank, Local: rp.asg.LocalRank,
						Message: fmt.Sprintf("rank %d: status record is not a JSON object (fd %d expects one object per line): %.80q", rp.asg.Rank, StatusFD, b)})
				}
			} else {
				a.emit(proto.Event{Type: proto.EventStatus, Rank: rp.asg.Rank, Local: rp.asg.LocalRank,
					Status: json.RawMessage(bytes.Clone(b))})
			}
		}
		if err != nil {
			return
		}
	}
}

// skipLine discards the rest of a line, returning how many bytes it
// dropped and, if the input ended first, why.
func skipLine(br *bufio.Reader) (int, error) {
	n := 0
	for {
		b, err := br.ReadSlice('\n')
		n += len(b)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return n, err
		}
	}
}

// oversizedStatus reports a dropped status record that did not fit.
func (a *agent) oversizedStatus(rp *rankProc, size int, end error) {
	what := fmt.Sprintf("%d bytes", size)
	if end != nil {
		what = fmt.Sprintf("at least %d bytes, cut off by the end of the channel", size)
	}
	a.emit(proto.Event{Type: proto.EventError, Rank: rp.asg.Rank, Local: rp.asg.LocalRank,
		Message: fmt.Sprintf("rank %d: status record of %s on fd %d dropped: the limit is %d bytes per line (keep records short; the channel goes on)",
			rp.asg.Rank, what, StatusFD, proto.MaxLogLine)})
}

// errorFile is what a failed rank recorded in its TORCHELASTIC_ERROR_FILE.
type errorFile struct {
	Message string
	// PeerFailed is gtrain's addition ("peer_failed": true): the rank
	// failed because a peer died, so it is not the cause of the failure.
	PeerFailed bool
}

// maxErrorFile bounds what is read of a rank's error file.
const maxErrorFile = 1 << 20

// readErrorFile returns what a failed rank recorded in its
// TORCHELASTIC_ERROR_FILE (written by torch's @record decorator, or by
// gtrain worker), or nothing.
func readErrorFile(path string) errorFile {
	if path == "" {
		return errorFile{}
	}
	f, err := os.Open(path)
	if err != nil {
		return errorFile{}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxErrorFile))
	if err != nil {
		return errorFile{}
	}
	var file struct {
		Message    json.RawMessage `json:"message"`
		PeerFailed bool            `json:"peer_failed"`
	}
	if json.Unmarshal(b, &file) != nil {
		return errorFile{}
	}
	ef := errorFile{PeerFailed: file.PeerFailed}
	var inner struct {
		Message string `json:"message"`
	}
	var s string
	switch {
	case json.Unmarshal(file.Message, &inner) == nil && inner.Message != "":
		ef.Message = strings.TrimSpace(inner.Message)
	case json.Unmarshal(file.Message, &s) == nil:
		ef.Message = strings.TrimSpace(s)
	}
	return ef
}

// mergeEnv returns base with the KEY=VALUE entries of each overlay applied in
// order: a later entry replaces an earlier one of the same key in place.
func mergeEnv(base []string, overlays ...[]string) []string {
	out := make([]string, 0, len(base)+8)
	idx := make(map[string]int, len(base)+8)
	add := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			return
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		add(kv)
	}
	for _, o := range overlays {
		for _, kv := range o {
			add(kv)
		}
	}
	return out
}

// withoutVars returns env without the named variables.
func withoutVars(env, names []string) []string {
	if len(names) == 0 {
		return env
	}
	drop := make(map[string]bool, len(names))
	for _, n := range names {
		drop[n] = true
	}
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			out = append(out, kv)
		}
	}
	return out
}

// rankProgram resolves a rank command's program. "gtrain" is this agent's
// own executable, so `gtrain run -- gtrain bench collectives` runs the same
// gtrain on every host (the copy the launcher put there), whatever is on
// the host's PATH; ranks of one job must never mix versions.
func rankProgram(name string) string {
	if name == "gtrain" {
		if exe, err := os.Executable(); err == nil {
			return exe
		}
	}
	return name
}

package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunPreemption: SIGTERM or SIGUSR1 to gtrain (a cancelled ctx whose
// cause names it) is forwarded to every rank as that same signal; ranks that
// answer with ExitResumable make the job's error a *ResumableError (exit
// 75), any other answer leaves it interrupted (128+n). SIGINT is not a
// preemption: the ranks get SIGTERM and the job is interrupted.
func TestRunPreemption(t *testing.T) {
	tests := []struct {
		sig       syscall.Signal
		code      int    // each rank's answer to the signal
		got       string // the signal the ranks' traps saw
		resumable bool
	}{
		{syscall.SIGUSR1, 75, "USR1", true},
		{syscall.SIGTERM, 75, "TERM", true},
		{syscall.SIGUSR1, 0, "USR1", false},
		{syscall.SIGINT, 75, "TERM", false},
	}
	for _, tt := range tests {
		t.Run(tt.sig.String()+"/exit "+strconv.Itoa(tt.code), func(t *testing.T) {
			dir := t.TempDir()
			script := `D=` + dir + `
trap 'echo USR1 > "$D/got.$RANK"; exit ` + strconv.Itoa(tt.code) + `' USR1
trap 'echo TERM > "$D/got.$RANK"; exit ` + strconv.Itoa(tt.code) + `' TERM
: > "$D/ready.$RANK"
while :; do sleep 1; done`
			ctx, cancel := context.WithCancelCause(t.Context())
			go func() {
				if awaitFiles(ctx, filepath.Join(dir, "ready.0"), filepath.Join(dir, "ready.1")) {
					cancel(&InterruptedError{Signal: tt.sig})
				}
			}()
			_, err := runJob(t, ctx, 2, 20*time.Second, script)
			var (
				re *ResumableError
				ie *InterruptedError
			)
			switch {
			case tt.resumable && (!errors.As(err, &re) || re.Signal != tt.sig):
				t.Fatalf("Run error = %v, want resumable after %v", err, tt.sig)
			case !tt.resumable && (!errors.As(err, &ie) || ie.Signal != tt.sig):
				t.Fatalf("Run error = %v, want interrupted by %v", err, tt.sig)
			}
			for r := range 2 {
				b, err := os.ReadFile(filepath.Join(dir, "got."+strconv.Itoa(r)))
				if err != nil || string(b) != tt.got+"\n" {
					t.Errorf("rank %d saw %q (%v), want %s", r, b, err, tt.got)
				}
			}
		})
	}
}

// awaitFiles polls until every file exists (the ranks' own signal that they
// are ready), or reports false when ctx ends first.
func awaitFiles(ctx context.Context, paths ...string) bool {
	for _, p := range paths {
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return false
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return true
}

// TestKilledBy: a rank's end is teardown's doing only when teardown had
// signalled it and, if a signal ended it, sent that signal: a SIGKILL from
// elsewhere during teardown's grace period is a failure to report.
func TestKilledBy(t *testing.T) {
	tests := []struct {
		name   string
		sent   []syscall.Signal
		signum int // 0: exited with a code
		want   bool
	}{
		{"not signalled, exited", nil, 0, false},
		{"not signalled, killed", nil, 9, false},
		{"SIGTERM sent, exited", []syscall.Signal{syscall.SIGTERM}, 0, true},
		{"SIGTERM sent, died of it", []syscall.Signal{syscall.SIGTERM}, 15, true},
		{"SIGTERM sent, SIGKILLed by someone else", []syscall.Signal{syscall.SIGTERM}, 9, false},
		{"SIGTERM then SIGKILL sent", []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, 9, true},
		{"SIGUSR1 forwarded, died of it", []syscall.Signal{syscall.SIGUSR1}, 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rp := &rankProc{}
			for _, s := range tt.sent {
				rp.sent(s)
			}
			if got := rp.killedBy(tt.signum); got != tt.want {
				t.Errorf("killedBy(%d) = %v, want %v", tt.signum, got, tt.want)
			}
		})
	}
}

// TestReadErrorFilePeerFailed: gtrain's peer_failed mark beside torch's
// forms of the error file, and files that are not error files.
func TestReadErrorFilePeerFailed(t *testing.T) {
	tests := []struct {
		name, content string
		want          errorFile
	}{
		{"torch record", `{"message": {"message": "RuntimeError: boom", "extraInfo": {"timestamp": "1"}}}`, errorFile{Message: "RuntimeError: boom"}},
		{"string message", `{"message": " plain \n"}`, errorFile{Message: "plain"}},
		{"peer failed", `{"message": {"message": "comm: peer process is gone"}, "peer_failed": true}`, errorFile{Message: "comm: peer process is gone", PeerFailed: true}},
		{"not json", `Traceback ...`, errorFile{}},
		{"too long to be one", `{"message": "` + strings.Repeat("x", maxErrorFile) + `"}`, errorFile{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "error.json")
			if err := os.WriteFile(p, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := readErrorFile(p); got != tt.want {
				t.Errorf("readErrorFile = %+v, want %+v", got, tt.want)
			}
		})
	}
	if got := readErrorFile(filepath.Join(t.TempDir(), "missing")); got != (errorFile{}) {
		t.Errorf("missing file: %+v", got)
	}
}

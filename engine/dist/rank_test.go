package dist

import (
	"io"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/internal/rankenv"
)

// TestAlone: a rank joins others only when WORLD_SIZE says there are any.
func TestAlone(t *testing.T) {
	for ws, want := range map[string]bool{"": true, "1": true, "2": false, "64": false} {
		if got := Alone(envMap(map[string]string{rankenv.WorldSize: ws})); got != want {
			t.Errorf("Alone with WORLD_SIZE=%q = %v, want %v", ws, got, want)
		}
	}
}

// TestRestartCount: the first attempt, a rank started by hand and a value
// that is not a number all count as no restart.
func TestRestartCount(t *testing.T) {
	for v, want := range map[string]int{"": 0, "0": 0, "2": 2, "x": 0} {
		if got := RestartCount(envMap(map[string]string{rankenv.RestartCount: v})); got != want {
			t.Errorf("RestartCount with %s=%q = %d, want %d", rankenv.RestartCount, v, got, want)
		}
	}
}

// TestStatusFile: the agent's status pipe is opened from its number; no
// number is no pipe, and a number that cannot be the agent's (stdin,
// stdout, stderr, or not a number) is refused, naming the variable.
func TestStatusFile(t *testing.T) {
	f, err := StatusFile(envMap(nil))
	if f != nil || err != nil {
		t.Errorf("StatusFile with %s unset = %v, %v; want nil, nil", rankenv.StatusFD, f, err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The file StatusFile opens owns its descriptor: give it a copy of the
	// pipe's, so that closing both closes neither twice.
	fd, err := syscall.Dup(int(w.Fd()))
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err = StatusFile(envMap(map[string]string{rankenv.StatusFD: strconv.Itoa(fd)}))
	if err != nil || f == nil || f.Fd() != uintptr(fd) {
		t.Fatalf("StatusFile(%d) = %v, %v; want the pipe", fd, f, err)
	}
	if _, err := f.WriteString("{}\n"); err != nil {
		t.Fatalf("write to the status pipe: %v", err)
	}
	f.Close()
	if b, err := io.ReadAll(r); err != nil || string(b) != "{}\n" {
		t.Errorf("read %q, %v from the status pipe; want the record written", b, err)
	}
	for _, bad := range []string{"1", "x", "-3"} {
		_, err := StatusFile(envMap(map[string]string{rankenv.StatusFD: bad}))
		if want := rankenv.StatusFD + `="` + bad + `": want a file descriptor number ≥ 3`; err == nil || err.Error() != want {
			t.Errorf("StatusFile(%q) = %v, want %q", bad, err, want)
		}
	}
}

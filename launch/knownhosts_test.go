package launch

import (
	"crypto/ed25519"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/gtrain/gtrain/internal/atomicfile"
)

// TestRememberKeySpecialFile: --ssh-accept-new appends to known_hosts
// through a symbolic link, and refuses a known_hosts that is a FIFO (no
// reader: opening it for writing would block for ever) without changing it.
// The test holds a reader open so that, without the check, the write goes
// into the FIFO and the test fails at once instead of blocking.
func TestRememberKeySpecialFile(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	target, link, fifo := filepath.Join(dir, "real"), filepath.Join(dir, "link"), filepath.Join(dir, "fifo")
	if err := os.Symlink("real", link); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	s := &SSH{}
	if err := s.rememberKey(link, "node1", key); err != nil {
		t.Fatalf("through a link: %v", err)
	}
	if b, err := os.ReadFile(target); err != nil || !strings.HasPrefix(string(b), "node1 ssh-ed25519 ") {
		t.Errorf("the link's target holds %q (%v), want the key's line", b, err)
	}
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var nr *atomicfile.NotRegularError
	if err := s.rememberKey(fifo, "node1", key); !errors.As(err, &nr) {
		t.Errorf("rememberKey(FIFO) = %v, want a *atomicfile.NotRegularError", err)
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		t.Errorf("the FIFO is now %v (%v)", fi, err)
	}
}

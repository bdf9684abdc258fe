package launch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kevinburke/ssh_config"
	"golang.org/x/crypto/ssh"
	sshagent "golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/gtrain/gtrain/internal/atomicfile"
	"github.com/gtrain/gtrain/internal/userfile"
)

// sshTarget is where and as whom to connect, after the hostfile, the flags
// and ~/.ssh/config have had their say.
type sshTarget struct {
	Alias      string // the name in the hostfile
	HostName   string // what to dial
	Port       int
	User       string
	Identities []string // identity files, in order
	ProxyJump  string   // "[user@]host[:port]" (first hop only), or ""
}

// Addr is host:port for dialing.
func (t sshTarget) Addr() string { return net.JoinHostPort(t.HostName, strconv.Itoa(t.Port)) }

// resolveTarget combines a hostfile host with the SSH settings: the hostfile's
// user and port win over ~/.ssh/config, which wins over --ssh-user and the
// defaults (port 22, the local user).
func (s *SSH) resolveTarget(ctx context.Context, h Host, user string, port int) sshTarget {
	cfg := s.sshConfig(ctx)
	t := sshTarget{Alias: h.Name, HostName: h.Name, Port: port, User: user}
	if hn := confGet(cfg, h.Name, "HostName"); hn != "" {
		t.HostName = strings.ReplaceAll(hn, "%h", h.Name)
	}
	if t.Port == 0 {
		if p, err := strconv.Atoi(confGet(cfg, h.Name, "Port")); err == nil && p > 0 {
			t.Port = p
		} else {
			t.Port = 22
		}
	}
	if t.User == "" {
		t.User = confGet(cfg, h.Name, "User")
	}
	if t.User == "" {
		t.User = s.Config.User
	}
	if t.User == "" {
		t.User = localUser()
	}
	if pj := confGet(cfg, h.Name, "ProxyJump"); pj != "" && !strings.EqualFold(pj, "none") {
		t.ProxyJump, _, _ = strings.Cut(pj, ",")
	}
	t.Identities = append(t.Identities, s.Config.Identities...)
	for _, f := range confGetAll(cfg, h.Name, "IdentityFile") {
		t.Identities = append(t.Identities, expandHome(f))
	}
	return t
}

// confGet reads one keyword of ~/.ssh/config (cfg, nil for none) for alias
// ("" when unset).
func confGet(cfg *ssh_config.Config, alias, key string) string {
	if cfg == nil {
		return ""
	}
	v, _ := cfg.Get(alias, key)
	return v
}

func confGetAll(cfg *ssh_config.Config, alias, key string) []string {
	if cfg == nil {
		return nil
	}
	v, _ := cfg.GetAll(alias, key)
	return v
}

// sshConfig loads the ssh_config file once, bounded (loadSSHConfig); a
// missing ~/.ssh/config is no config, a missing --ssh-config or a broken
// file (too large, unreadable, not parsed) is reported once and ignored,
// and so is, silently, one whose read ctx stopped.
func (s *SSH) sshConfig(ctx context.Context) *ssh_config.Config {
	s.confOnce.Do(func() {
		path := s.Config.ConfigFile
		if path == "none" {
			return
		}
		if path == "" {
			path = filepath.Join(homeDir(), ".ssh", "config")
		}
		cfg, err := loadSSHConfig(ctx, path)
		var ue *userfile.Error
		switch {
		case err == nil:
			s.conf = cfg
		case ctx.Err() != nil: // the job is being stopped
		case errors.As(err, &ue) && ue.Path == path && errors.Is(err, fs.ErrNotExist) && s.Config.ConfigFile == "":
			// No ~/.ssh/config: nothing to say. A missing --ssh-config is
			// a typo the user must hear of (below).
		default:
			s.warn(fmt.Sprintf("ssh: ignoring %s: %v", path, err))
		}
	})
	return s.conf
}

// authMethods are the ssh-agent's keys (SSH_AUTH_SOCK) and the identity
// files: the target's, else the usual ~/.ssh/id_*.
func (s *SSH) authMethods(ctx context.Context, t sshTarget) []ssh.AuthMethod {
	var signers []ssh.Signer
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" {
		if conn, err := net.Dial("unix", sock); err == nil {
			if ss, err := sshagent.NewClient(conn).Signers(); err == nil {
				signers = append(signers, ss...)
			}
		}
	}
	files := t.Identities
	if len(files) == 0 {
		for _, n := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
			files = append(files, filepath.Join(homeDir(), ".ssh", n))
		}
	}
	for _, f := range files {
		sg, err := loadSigner(ctx, f)
		switch {
		case err == nil:
			signers = append(signers, sg)
		case ctx.Err() != nil:
			return nil // the dial fails with ctx's error
		case !errors.Is(err, os.ErrNotExist) || slices.Contains(s.Config.Identities, f):
			s.warn("ssh: identity " + err.Error()) // err names f
		}
	}
	return []ssh.AuthMethod{ssh.PublicKeys(signers...)}
}

// HostKeyError is a refused host key: unknown (not in known_hosts) or
// changed (known_hosts has another key for the host).
type HostKeyError struct {
	Host    string // the host as the hostfile names it
	Changed bool
	Files   []string
	// KeyHost and Port are where the key was offered (the ssh_config
	// HostName and port): known_hosts stores a host on a port other than
	// 22 as "[KeyHost]:Port", so the hints must name it that way.
	KeyHost string
	Port    int
}

func (e *HostKeyError) Error() string {
	if e.Changed {
		return fmt.Sprintf("ssh: host key of %s CHANGED (known_hosts: %s): this could be an attack; if the host was reinstalled, remove the old key with `%s` and connect again",
			e.Host, strings.Join(e.Files, ", "), e.RemoveHint())
	}
	return fmt.Sprintf("ssh: host key of %s is not in %s: check it and add it (%s >> ~/.ssh/known_hosts), or pass --ssh-accept-new to trust it on first use",
		e.Host, strings.Join(e.Files, ", "), e.ScanHint())
}

// keyHost is the host name as known_hosts stores it, without a port.
func (e *HostKeyError) keyHost() string {
	if e.KeyHost != "" {
		return strings.Trim(e.KeyHost, "[]")
	}
	return strings.Trim(e.Host, "[]")
}

// RemoveHint is the command that removes the host's stored key:
// `ssh-keygen -R '[host]:port'` for a port other than 22, quoted because
// a shell would read the brackets as a pattern.
func (e *HostKeyError) RemoveHint() string {
	if e.Port == 0 || e.Port == 22 {
		return "ssh-keygen -R " + shellWord(e.keyHost())
	}
	return "ssh-keygen -R " + shellQuote("["+e.keyHost()+"]:"+strconv.Itoa(e.Port))
}

// ScanHint is the command that fetches the host's key: ssh-keyscan takes
// the port as -p, never as host:port.
func (e *HostKeyError) ScanHint() string {
	if e.Port == 0 || e.Port == 22 {
		return "ssh-keyscan " + shellWord(e.keyHost())
	}
	return "ssh-keyscan -p " + strconv.Itoa(e.Port) + " " + shellWord(e.keyHost())
}

// shellWord quotes s for a POSIX shell only when it needs it.
func shellWord(s string) string {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.:@%+/", c)) {
			return shellQuote(s)
		}
	}
	if s == "" {
		return "''"
	}
	return s
}

// hostKeys returns the host key callback for t and the host key algorithms
// to offer: only the types known_hosts holds for the host, so that a host
// with several keys is not reported as changed because it offered another
// type first.
func (s *SSH) hostKeys(ctx context.Context, t sshTarget) (ssh.HostKeyCallback, []string, error) {
	files := s.Config.KnownHosts
	if len(files) == 0 {
		files = []string{filepath.Join(homeDir(), ".ssh", "known_hosts")}
	}
	check := func(string, net.Addr, ssh.PublicKey) error { return &knownhosts.KeyError{} }
	kh, existing, err := knownHostsCallback(ctx, files)
	if err != nil {
		return nil, nil, err
	}
	if kh != nil {
		check = kh
	}
	algos := knownAlgorithms(check, t.Addr())
	cb := func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		err := check(hostname, remote, key)
		var ke *knownhosts.KeyError
		if !errors.As(err, &ke) {
			return err // nil, or revoked
		}
		if len(ke.Want) > 0 {
			return &HostKeyError{Host: t.Alias, Changed: true, Files: existing, KeyHost: t.HostName, Port: t.Port}
		}
		if !s.Config.AcceptNew {
			return &HostKeyError{Host: t.Alias, Files: files, KeyHost: t.HostName, Port: t.Port}
		}
		return s.rememberKey(files[0], hostname, key)
	}
	return cb, algos, nil
}

// knownAlgorithms asks the known_hosts callback which key types it holds for
// addr, by offering it a key it cannot know.
func knownAlgorithms(check ssh.HostKeyCallback, addr string) []string {
	err := check(addr, &net.TCPAddr{}, unknownKey{})
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for _, k := range ke.Want {
		for _, a := range algorithmsFor(k.Key.Type()) {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}

// algorithmsFor lists the signature algorithms that use a key type (an RSA
// key signs with SHA-2 too).
func algorithmsFor(keyType string) []string {
	if keyType == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	}
	return []string{keyType}
}

// unknownKey is a public key no known_hosts file contains.
type unknownKey struct{}

func (unknownKey) Type() string                        { return "gtrain-probe" }
func (unknownKey) Marshal() []byte                     { return []byte("gtrain-probe") }
func (unknownKey) Verify([]byte, *ssh.Signature) error { return errors.New("probe key") }

// rememberKey appends a first-seen host key to known_hosts (--ssh-accept-new).
func (s *SSH) rememberKey(file, hostname string, key ssh.PublicKey) error {
	s.khMu.Lock()
	defer s.khMu.Unlock()
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	// Not os.OpenFile: a known_hosts that is a device or FIFO is refused
	// rather than written into or blocked on.
	f, err := atomicfile.OpenAppend(file, 0o600)
	if err != nil {
		return fmt.Errorf("ssh: remember host key: %w", err)
	}
	defer f.Close()
	line := knownhosts.Line([]string{knownhosts.Normalize(hostname)}, key)
	if _, err := f.WriteString(line + "\n"); err != nil {
		return fmt.Errorf("ssh: remember host key: %w", err)
	}
	s.warn(fmt.Sprintf("ssh: added the %s key of %s to %s (--ssh-accept-new)", key.Type(), hostname, file))
	return f.Sync()
}

func homeDir() string {
	if h, err := os.UserHomeDir(); err == nil {
		return h
	}
	return "/"
}

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		return filepath.Join(homeDir(), rest)
	}
	return p
}

func localUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return os.Getenv("USER")
}

package launch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kevinburke/ssh_config"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/gtrain/gtrain/internal/userfile"
)

// Size limits of the SSH files gtrain reads: the user names them (--identity,
// --ssh-config, --ssh-known-hosts) or they are the user's own, and none may
// exhaust memory or time because it is /dev/zero or far larger than any
// real one.
const (
	// maxIdentityFile: a 16384-bit RSA key, the largest ssh-keygen makes,
	// is about 12 KiB; 1 MiB leaves room for any key and its comments.
	maxIdentityFile = 1 << 20
	// maxSSHConfig bounds an ssh_config together with every file its
	// Include lines read: userfile.ConfigLimit, the limit of the other text
	// files a user writes by hand (some 50 000 Host blocks).
	maxSSHConfig = userfile.ConfigLimit
	// maxSSHConfigLine bounds a line of an ssh_config: the parser's time
	// grows with the square of a line's length (a 64 KiB line takes
	// seconds), and no real line comes near 4 KiB.
	maxSSHConfigLine = 4 << 10
	// maxKnownHosts: a known_hosts line is at most about 1 KiB (an
	// RSA-4096 key under a hashed name), so 64 MiB holds some 60 000 hosts
	// or more, beyond any site's file, and parses in about a second.
	maxKnownHosts = 64 << 20
)

// loadSigner reads an unencrypted private key file, of at most
// maxIdentityFile bytes. Encrypted keys belong in ssh-agent. Its errors
// name the file.
func loadSigner(ctx context.Context, path string) (ssh.Signer, error) {
	b, err := userfile.Read(ctx, path, maxIdentityFile)
	if err != nil {
		return nil, err
	}
	sg, err := ssh.ParsePrivateKey(b)
	var pass *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &pass):
		return nil, fmt.Errorf("%s: key is encrypted: add it to ssh-agent (ssh-add) instead", path)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sg, nil
}

// loadSSHConfig reads and parses the ssh_config file at path. The file and
// every file its Include lines read come to at most maxSSHConfig bytes,
// with lines of at most maxSSHConfigLine bytes. ssh_config reads the
// included files itself, by name and to their end, so they are checked
// first: each must be a regular file (a FIFO would block that read and
// /dev/zero never end it) within what is left of the limit.
func loadSSHConfig(ctx context.Context, path string) (*ssh_config.Config, error) {
	b, err := userfile.Read(ctx, path, maxSSHConfig)
	if err != nil {
		return nil, err
	}
	left := int64(maxSSHConfig - len(b))
	if err := checkSSHConfig(path, b, false, 0, &left); err != nil {
		return nil, err
	}
	return ssh_config.DecodeBytes(b)
}

// maxIncludeDepth is ssh_config's: it refuses, without reading it, a file
// included at a greater depth.
const maxIncludeDepth = 5

// checkSSHConfig checks the lines of b, the ssh_config file path (a system
// one under /etc/ssh, included at depth), and the files it includes, as
// ssh_config will find them, taking what they read from *left.
func checkSSHConfig(path string, b []byte, system bool, depth int, left *int64) error {
	for i, line := range strings.Split(string(b), "\n") {
		if len(line) > maxSSHConfigLine {
			return fmt.Errorf("%s:%d: a line of more than %s, the limit for an ssh_config line", path, i+1, userfile.Size(maxSSHConfigLine))
		}
		args, ok := includeArgs(line)
		if !ok || depth+1 > maxIncludeDepth {
			continue
		}
		for _, arg := range args {
			matches, err := filepath.Glob(includePath(arg, system))
			if err != nil {
				return nil // ssh_config fails on the same pattern, reading nothing
			}
			for _, m := range matches {
				inc, err := userfile.ReadRegular(m, *left)
				if errors.Is(err, userfile.ErrTooLarge) {
					return fmt.Errorf("%s:%d: Include %s: with the files before it, over %s, the limit for an ssh_config and the files it includes", path, i+1, m, userfile.Size(maxSSHConfig))
				}
				if err != nil {
					return fmt.Errorf("%s:%d: Include: %w", path, i+1, err)
				}
				*left -= int64(len(inc))
				if err := checkSSHConfig(m, inc, isSystemSSHConfig(m), depth+1, left); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// includeArgs returns the arguments of an Include line as ssh_config's
// lexer and parser split them: the keyword up to a space, tab or '=', an
// optional '=' between blanks, the value up to a '#', split at spaces.
func includeArgs(line string) ([]string, bool) {
	line = strings.TrimLeft(strings.TrimSuffix(line, "\r"), " \t")
	i := strings.IndexAny(line, " \t=")
	if i < 0 || !strings.EqualFold(line[:i], "include") {
		return nil, false
	}
	val := strings.TrimLeft(line[i+1:], " \t")
	val = strings.TrimLeft(strings.TrimPrefix(val, "="), " \t")
	val, _, _ = strings.Cut(val, "#")
	var args []string
	for _, a := range strings.Split(val, " ") {
		if a != "" { // ssh_config reads "" as ~/.ssh, a directory: it fails at once
			args = append(args, a)
		}
	}
	return args, true
}

// includePath is where ssh_config looks for an Include argument: an
// absolute path as it is, ~/ under the home directory, other relative
// paths under ~/.ssh, or /etc/ssh in a system file.
func includePath(arg string, system bool) string {
	switch {
	case filepath.IsAbs(arg):
		return arg
	case system:
		return filepath.Join("/etc/ssh", arg)
	case strings.HasPrefix(arg, "~/"):
		return filepath.Join(sshConfigHome(), arg[2:])
	}
	return filepath.Join(sshConfigHome(), ".ssh", arg)
}

// sshConfigHome is the home directory as ssh_config finds it: the user
// database's, else $HOME.
func sshConfigHome() string {
	if u, err := user.Current(); err == nil {
		return u.HomeDir
	}
	return os.Getenv("HOME")
}

// isSystemSSHConfig is ssh_config's test for a system file, whose
// relative Include paths are under /etc/ssh.
func isSystemSSHConfig(path string) bool {
	return strings.HasPrefix(filepath.Clean(path), "/etc/ssh")
}

// knownHostsCallback is knownhosts.New over files, read bounded. The
// package opens and reads each file by name to its end, so each is read
// here first, at most maxKnownHosts bytes (stopped by ctx while blocked),
// and the package reads a private copy of what was read. Missing files
// are skipped; read returns those that were read, and cb is nil when none
// was.
func knownHostsCallback(ctx context.Context, files []string) (cb ssh.HostKeyCallback, read []string, err error) {
	var contents [][]byte
	for _, f := range files {
		b, err := userfile.Read(ctx, f, maxKnownHosts)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("ssh: read known_hosts: %w", err)
		}
		contents, read = append(contents, b), append(read, f)
	}
	if len(read) == 0 {
		return nil, nil, nil
	}
	copies, done, err := copyKnownHosts(read, contents)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	if cb, err = knownhosts.New(copies...); err != nil {
		// knownhosts names the file it read ("knownhosts: FILE:LINE: ..."):
		// name the user's instead of the copy.
		msg := err.Error()
		for i := len(copies) - 1; i >= 0; i-- { // ".../10" before ".../1"
			msg = strings.ReplaceAll(msg, copies[i], read[i])
		}
		return nil, nil, fmt.Errorf("ssh: read known_hosts: %s", msg)
	}
	return cb, read, nil
}

// copyKnownHosts writes contents into new files of a private temporary
// directory, which done removes. Without one (TMPDIR unwritable) it
// returns the files themselves if each is a regular file, as they were
// just read within the limit: a FIFO or device would be read again
// unbounded.
func copyKnownHosts(files []string, contents [][]byte) (copies []string, done func(), err error) {
	dir, err := os.MkdirTemp("", "gtrain-known_hosts-")
	if err != nil {
		for _, f := range files {
			if fi, serr := os.Stat(f); serr != nil || !fi.Mode().IsRegular() {
				return nil, nil, fmt.Errorf("ssh: read known_hosts %s: not a regular file, and no temporary directory to copy it into: %w", f, err)
			}
		}
		return files, func() {}, nil
	}
	done = func() { os.RemoveAll(dir) }
	for i, b := range contents {
		c := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(c, b, 0o600); err != nil {
			done()
			return nil, nil, fmt.Errorf("ssh: read known_hosts %s: copy it to parse: %w", files[i], err)
		}
		copies = append(copies, c)
	}
	return copies, done, nil
}

package launch

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/proctest"
	"github.com/gtrain/gtrain/launch/proto"
)

// sshJob is a job of n ranks running script on the test server, addressed
// as name (an alias resolved through ssh_config when configured).
func sshJob(t *testing.T, srv *testSSHServer, name string, port, n int, script string) *Job {
	t.Helper()
	slots := make([]int, n)
	for i := range slots {
		slots[i] = i
	}
	node := hostfiles.Node{Host: hostfiles.Host{Name: name, Port: port, Slots: n}, SlotIDs: slots}
	p, err := NewJob(JobOptions{Nodes: []hostfiles.Node{node}, Command: []string{"sh", "-c", script},
		Grace: time.Second, Heartbeat: time.Second, MasterPort: 1, Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testSSH is the transport for the test server, running the test binary as
// the remote gtrain (it acts as the agent under GTRAIN_TEST_AGENT=1).
func testSSH(srv *testSSHServer, knownHosts string) *SSH {
	return &SSH{Config: SSHConfig{
		Identities: []string{srv.clientID}, KnownHosts: []string{knownHosts}, ConfigFile: "none",
		RemoteGtrain: os.Args[0], ConnectTimeout: 5 * time.Second,
	}}
}

func TestSSHRunJob(t *testing.T) {
	srv := startSSHServer(t, "GTRAIN_TEST_AGENT=1")
	p := sshJob(t, srv, "127.0.0.1", srv.port, 2, `echo "rank $RANK of $WORLD_SIZE on $GTRAIN_HOST"`)
	rec := &recorder{}
	err := Run(t.Context(), p, Runtime{Transport: testSSH(srv, srv.knownHosts(t, srv.hostKey.PublicKey())), View: rec})
	if err != nil {
		t.Fatalf("Run over SSH: %v", err)
	}
	for r := range 2 {
		want := "rank " + strconv.Itoa(r) + " of 2 on 127.0.0.1"
		if got := rec.lines(r); len(got) != 1 || got[0] != want {
			t.Errorf("rank %d lines = %q, want [%q]", r, got, want)
		}
	}
	if n := srv.execs.Load(); n != 1 {
		t.Errorf("exec requests = %d, want 1 (one session per host)", n)
	}
}

// TestSSHDisconnectTearsDown: when the launcher's connection drops, the
// remote agent sees EOF, kills its ranks and removes its directory.
func TestSSHDisconnectTearsDown(t *testing.T) {
	tmp := t.TempDir() // the agent's TMPDIR
	srv := startSSHServer(t, "GTRAIN_TEST_AGENT=1", "TMPDIR="+tmp)
	tr := testSSH(srv, srv.knownHosts(t, srv.hostKey.PublicKey()))
	p := sshJob(t, srv, "127.0.0.1", srv.port, 2, `echo "pid=$$"; exec sleep 300`)
	conn, err := tr.Start(t.Context(), p.Hosts[0], p.Assignment(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Send(proto.Command{Type: proto.CommandStart}); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for len(pids) < 2 {
		ev, err := conn.Recv()
		if err != nil {
			t.Fatalf("Recv: %v (pids so far %v)", err, pids)
		}
		if ev.Type == proto.EventLog {
			pids = append(pids, pidsIn([]string{ev.Line})...)
		}
	}
	conn.Kill()
	deadline := time.Now().Add(20 * time.Second)
	for _, pid := range pids {
		for proctest.Alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("rank pid %d still running after the connection dropped", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The agent tore down and removed its directory (with the store
	// secret) rather than die of the broken pipe to the launcher.
	for {
		entries, err := os.ReadDir(tmp)
		if err == nil && len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's TMPDIR still holds %v (%v) after the connection dropped", entries, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSSHHostKeys(t *testing.T) {
	srv := startSSHServer(t, "GTRAIN_TEST_AGENT=1")
	other, _ := newKey(t)
	p := sshJob(t, srv, "127.0.0.1", srv.port, 1, `true`)
	tests := []struct {
		name        string
		knownHosts  string
		acceptNew   bool
		wantChanged bool
		wantErr     bool
	}{
		{"known key", srv.knownHosts(t, srv.hostKey.PublicKey()), false, false, false},
		{"unknown host refused", filepath.Join(t.TempDir(), "known_hosts"), false, false, true},
		{"changed key refused", srv.knownHosts(t, other.PublicKey()), false, true, true},
		{"changed key refused even with accept-new", srv.knownHosts(t, other.PublicKey()), true, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := testSSH(srv, tt.knownHosts)
			tr.Config.AcceptNew = tt.acceptNew
			conn, err := tr.Start(t.Context(), p.Hosts[0], p.Assignment(0, 0))
			if !tt.wantErr {
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				conn.Close()
				return
			}
			var hk *HostKeyError
			if !errors.As(err, &hk) || hk.Changed != tt.wantChanged {
				t.Fatalf("Start error = %v, want HostKeyError{Changed: %v}", err, tt.wantChanged)
			}
			if want := map[bool]string{true: "ssh-keygen -R", false: "--ssh-accept-new"}[tt.wantChanged]; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say what to do (%s)", err, want)
			}
			// The server is on a port other than 22: the hint names it so.
			port := strconv.Itoa(srv.port)
			if want := map[bool]string{true: "ssh-keygen -R '[127.0.0.1]:" + port + "'", false: "ssh-keyscan -p " + port + " 127.0.0.1"}[tt.wantChanged]; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks the hint %s", err, want)
			}
		})
	}
}

// TestSSHAcceptNew: with --ssh-accept-new an unknown host is trusted once and
// remembered, so the next connection needs no flag.
func TestSSHAcceptNew(t *testing.T) {
	srv := startSSHServer(t, "GTRAIN_TEST_AGENT=1")
	kh := filepath.Join(t.TempDir(), "known_hosts")
	p := sshJob(t, srv, "127.0.0.1", srv.port, 1, `true`)
	tr := testSSH(srv, kh)
	tr.Config.AcceptNew = true
	conn, err := tr.Start(t.Context(), p.Hosts[0], p.Assignment(0, 0))
	if err != nil {
		t.Fatalf("first connection with accept-new: %v", err)
	}
	conn.Close()
	conn, err = testSSH(srv, kh).Start(t.Context(), p.Hosts[0], p.Assignment(0, 0))
	if err != nil {
		t.Fatalf("second connection, key remembered: %v", err)
	}
	conn.Close()
}

func TestSSHUnreachable(t *testing.T) {
	srv := startSSHServer(t)
	kh := srv.knownHosts(t, srv.hostKey.PublicKey())
	closed := freeLoopbackPort(t)
	tests := []struct {
		name string
		port int
		tr   func() *SSH
		want string
	}{
		{"refused", closed, func() *SSH { return testSSH(srv, kh) }, "refused"},
		{"bad key", srv.port, func() *SSH {
			tr := testSSH(srv, kh)
			_, pemKey := newKey(t)
			path := filepath.Join(t.TempDir(), "id")
			_ = os.WriteFile(path, pemKey, 0o600)
			tr.Config.Identities = []string{path}
			return tr
		}, "authentication failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := sshJob(t, srv, "127.0.0.1", tt.port, 1, `true`)
			start := time.Now()
			_, err := tt.tr().Start(t.Context(), p.Hosts[0], p.Assignment(0, 0))
			var he *HostError
			if !errors.As(err, &he) || !strings.Contains(err.Error(), tt.want) || he.Host != "127.0.0.1" {
				t.Fatalf("Start error = %v, want a HostError for 127.0.0.1 saying %q", err, tt.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("failing took %v, want fast", d)
			}
		})
	}
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestSSHCopiesItself: without --remote-gtrain the binary is copied once into
// the remote user's cache, named by its hash, and reused after.
func TestSSHCopiesItself(t *testing.T) {
	home := t.TempDir()
	srv := startSSHServer(t, "GTRAIN_TEST_AGENT=1", "HOME="+home)
	tr := testSSH(srv, srv.knownHosts(t, srv.hostKey.PublicKey()))
	tr.Config.RemoteGtrain = ""
	p := sshJob(t, srv, "127.0.0.1", srv.port, 1, `echo copied`)
	for i := range 2 {
		rec := &recorder{}
		if err := Run(t.Context(), p, Runtime{Transport: tr, View: rec}); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if got := rec.lines(0); len(got) != 1 || got[0] != "copied" {
			t.Errorf("run %d: lines %q", i, got)
		}
	}
	_, hash, _ := tr.self()
	want := filepath.Join(home, ".cache", "gtrain", "gtrain-"+hash[:16])
	entries, _ := os.ReadDir(filepath.Dir(want))
	if len(entries) != 1 || entries[0].Name() != filepath.Base(want) {
		t.Errorf("cache holds %v, want only %s (no temp files left)", entries, filepath.Base(want))
	}
	if st, err := os.Stat(want); err != nil || st.Mode().Perm()&0o100 == 0 {
		t.Errorf("cached gtrain %s: %v (mode %v), want an executable", want, err, st)
	}
}

// TestSSHConfigAlias: ~/.ssh/config's HostName, Port and IdentityFile are used
// for a hostfile name that is an alias.
func TestSSHConfigAlias(t *testing.T) {
	srv := startSSHServer(t, "GTRAIN_TEST_AGENT=1")
	conf := filepath.Join(t.TempDir(), "config")
	body := "Host trainer-*\n  HostName 127.0.0.1\n  Port " + strconv.Itoa(srv.port) + "\n  IdentityFile " + srv.clientID + "\n  User someone\n"
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := testSSH(srv, srv.knownHosts(t, srv.hostKey.PublicKey()))
	tr.Config.ConfigFile = conf
	tr.Config.Identities = nil
	tgt := tr.resolveTarget(t.Context(), Host{Name: "trainer-7"}, "", 0)
	if tgt.HostName != "127.0.0.1" || tgt.Port != srv.port || tgt.User != "someone" || len(tgt.Identities) != 1 {
		t.Fatalf("resolved %+v", tgt)
	}
	if got := tr.resolveTarget(t.Context(), Host{Name: "trainer-7"}, "alice", 2200); got.User != "alice" || got.Port != 2200 {
		t.Errorf("hostfile user/port should win over ssh_config: %+v", got)
	}
	p := sshJob(t, srv, "trainer-7", 0, 1, `echo via alias`)
	rec := &recorder{}
	if err := Run(t.Context(), p, Runtime{Transport: tr, View: rec}); err != nil {
		t.Fatalf("Run via alias: %v", err)
	}
	if got := rec.lines(0); len(got) != 1 || got[0] != "via alias" {
		t.Errorf("lines %q", got)
	}
}

// TestHostKeyHints: the commands a refused host key suggests name a host on
// a port other than 22 the way known_hosts stores it ('[host]:port') and
// the way ssh-keyscan takes it (-p port host).
func TestHostKeyHints(t *testing.T) {
	tests := []struct {
		name, host, keyHost string
		port                int
		remove, scan        string
	}{
		{"port 22", "gpu1", "gpu1", 22, "ssh-keygen -R gpu1", "ssh-keyscan gpu1"},
		{"port unknown", "gpu1", "", 0, "ssh-keygen -R gpu1", "ssh-keyscan gpu1"},
		{"other port", "gpu1", "gpu1", 2222, "ssh-keygen -R '[gpu1]:2222'", "ssh-keyscan -p 2222 gpu1"},
		{"alias with HostName", "gpu1", "10.0.0.5", 2200, "ssh-keygen -R '[10.0.0.5]:2200'", "ssh-keyscan -p 2200 10.0.0.5"},
		{"ipv6 port 22", "[fe80::1]", "fe80::1", 22, "ssh-keygen -R fe80::1", "ssh-keyscan fe80::1"},
		{"ipv6 other port", "[fe80::1]", "fe80::1", 2222, "ssh-keygen -R '[fe80::1]:2222'", "ssh-keyscan -p 2222 fe80::1"},
		{"odd name quoted", "a b", "a b", 22, "ssh-keygen -R 'a b'", "ssh-keyscan 'a b'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &HostKeyError{Host: tt.host, KeyHost: tt.keyHost, Port: tt.port, Files: []string{"kh"}}
			if got := e.RemoveHint(); got != tt.remove {
				t.Errorf("RemoveHint = %q, want %q", got, tt.remove)
			}
			if got := e.ScanHint(); got != tt.scan {
				t.Errorf("ScanHint = %q, want %q", got, tt.scan)
			}
			if msg := e.Error(); !strings.Contains(msg, tt.scan) {
				t.Errorf("unknown-key error %q lacks %q", msg, tt.scan)
			}
			e.Changed = true
			if msg := e.Error(); !strings.Contains(msg, "`"+tt.remove+"`") {
				t.Errorf("changed-key error %q lacks `%s`", msg, tt.remove)
			}
		})
	}
}

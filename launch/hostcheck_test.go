package launch

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The host check against the in-process SSH server (sshserver_test.go):
// every host is 127.0.0.1 on the server's port.

// writeScript writes an executable shell script name into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeGtrain is a stand-in for gtrain on the hosts: it answers `version`.
func fakeGtrain(t *testing.T) string {
	return writeScript(t, t.TempDir(), "gtrain", `[ "$1" = version ] && echo "gtrain v9.9.9"`)
}

// checkServer starts a test server whose sessions have their own HOME (no
// gtrain cache) and extra env.
func checkServer(t *testing.T, env ...string) *testSSHServer {
	return startSSHServer(t, append([]string{"HOME=" + t.TempDir()}, env...)...)
}

// remoteHost is node n on srv.
func remoteHost(srv *testSSHServer, n int, slots ...int) Host {
	return Host{Name: "127.0.0.1", Addr: srv.addr, Node: n, Slots: slots}
}

// checker is a HostCheck trusting and logging in to every server given.
func checker(t *testing.T, srvs ...*testSSHServer) *HostCheck {
	t.Helper()
	s := testSSH(srvs[0], srvs[0].knownHosts(t, srvs[0].hostKey.PublicKey()))
	s.Config.RemoteGtrain = fakeGtrain(t)
	for _, srv := range srvs[1:] {
		s.Config.Identities = append(s.Config.Identities, srv.clientID)
		s.Config.KnownHosts = append(s.Config.KnownHosts, srv.knownHosts(t, srv.hostKey.PublicKey()))
	}
	return &HostCheck{SSH: s, Version: "v1.0.0-local"}
}

func TestHostCheckAllOK(t *testing.T) {
	requireBash(t)
	gpuDir := t.TempDir()
	writeScript(t, gpuDir, "nvidia-smi", `printf 'GPU 0: Fake (UUID: a)\n  MIG 1g.5gb Device 0: (UUID: b)\nGPU 1: Fake (UUID: c)\n'`)
	srv0, srv1 := checkServer(t), checkServer(t, "PATH="+gpuDir+":"+os.Getenv("PATH"))
	reports := checker(t, srv0, srv1).Check(t.Context(), []Host{remoteHost(srv0, 0, 0), remoteHost(srv1, 1, 0, 1)})
	if len(reports) != 2 {
		t.Fatalf("got %d reports, want 2", len(reports))
	}
	want := unameFor(runtime.GOOS, runtime.GOARCH)
	for i, r := range reports {
		if !r.OK || r.Error != "" {
			t.Errorf("host %d not ready: %+v", i, r)
		}
		for name, c := range map[string]CheckResult{"reach": r.Reach, "auth": r.Auth, "host key": r.HostKey, "gtrain": r.Gtrain, "system": r.System, "gpu": r.GPU, "master": r.Master} {
			if c.State != CheckOK {
				t.Errorf("host %d: %s = %+v, want ok", i, name, c)
			}
		}
		if r.GtrainVersion != "v9.9.9" || r.OSArch != want || r.CPUs < 1 {
			t.Errorf("host %d: gtrain %q, os/arch %q, cpus %d; want v9.9.9, %q, >0", i, r.GtrainVersion, r.OSArch, r.CPUs, want)
		}
	}
	if r := reports[0]; r.GPUs != 0 || r.GPU.Detail != "no nvidia-smi" || r.Master.Detail != "master" {
		t.Errorf("node 0: gpus %d (%q), master %+v; want 0 (no nvidia-smi) and master", r.GPUs, r.GPU.Detail, r.Master)
	}
	if r := reports[1]; r.GPUs != 2 || r.MasterAddr != srv0.addr {
		t.Errorf("node 1: gpus %d, master addr %q; want 2 (MIG devices not counted) and %s", r.GPUs, r.MasterAddr, srv0.addr)
	}
}

// TestHostCheckFailures: one host, one thing wrong with it each; the check
// names the step and the reason, and says why in the error.
func TestHostCheckFailures(t *testing.T) {
	t.Setenv("SSH_AUTH_SOCK", "") // only the test's keys
	otherKey, otherPEM := newKey(t)
	otherID := filepath.Join(t.TempDir(), "id_other")
	if err := os.WriteFile(otherID, otherPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	closed := closedPort(t)
	tests := []struct {
		name    string
		env     []string
		setup   func(*testSSHServer, *HostCheck, *Host)
		step    func(HostReport) CheckResult
		state   CheckState
		detail  string
		ok      bool
		errWant string
	}{
		{"unknown host key", nil, func(_ *testSSHServer, hc *HostCheck, _ *Host) {
			empty := filepath.Join(t.TempDir(), "known_hosts")
			os.WriteFile(empty, nil, 0o600)
			hc.SSH.Config.KnownHosts = []string{empty}
		}, hostKeyOf, CheckFailed, "unknown key", false, "is not in"},
		{"changed host key", nil, func(srv *testSSHServer, hc *HostCheck, _ *Host) {
			hc.SSH.Config.KnownHosts = []string{srv.knownHosts(t, otherKey.PublicKey())}
		}, hostKeyOf, CheckFailed, "changed key", false, "CHANGED"},
		{"refused port", nil, func(_ *testSSHServer, _ *HostCheck, h *Host) {
			h.Addr = closed
		}, reachOf, CheckFailed, "refused", false, "connection refused"},
		{"bad auth", nil, func(_ *testSSHServer, hc *HostCheck, _ *Host) {
			hc.SSH.Config.Identities = []string{otherID}
		}, authOf, CheckFailed, "denied", false, "unable to authenticate"},
		{"gtrain absent, same OS", nil, func(_ *testSSHServer, hc *HostCheck, _ *Host) {
			hc.SSH.Config.RemoteGtrain = ""
		}, gtrainOf, CheckOK, "absent: will be copied on first run", true, ""},
		{"remote gtrain missing", nil, func(_ *testSSHServer, hc *HostCheck, _ *Host) {
			hc.SSH.Config.RemoteGtrain = "/nonexistent/gtrain"
		}, gtrainOf, CheckFailed, "not found", false, "--remote-gtrain /nonexistent/gtrain: not found"},
		{"gtrain hangs", nil, func(_ *testSSHServer, hc *HostCheck, _ *Host) {
			hc.SSH.Config.RemoteGtrain = writeScript(t, t.TempDir(), "gtrain", "exec sleep 30")
			hc.SSH.Config.ConnectTimeout = time.Second
		}, gtrainOf, CheckFailed, "timed out", false, "timed out after 1s"},
		{"nvidia-smi fails", []string{"PATH=" + fakeNvidiaSMI(t, `echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9`) + ":" + os.Getenv("PATH")},
			nil, gpuOf, CheckFailed, "", false, "couldn't communicate with the NVIDIA driver"},
		{"slot beyond GPUs", []string{"PATH=" + fakeNvidiaSMI(t, `echo "GPU 0: Fake (UUID: a)"`) + ":" + os.Getenv("PATH")},
			func(_ *testSSHServer, _ *HostCheck, h *Host) { h.Slots = []int{0, 1} },
			gpuOf, CheckFailed, "slot 1 but 1 GPUs", false, "slot 1 (a device id) but nvidia-smi lists 1 GPU(s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := checkServer(t, tt.env...)
			hc := checker(t, srv)
			h := remoteHost(srv, 0)
			if tt.setup != nil {
				tt.setup(srv, hc, &h)
			}
			start := time.Now()
			r := hc.Check(t.Context(), []Host{h})[0]
			if got := tt.step(r); got.State != tt.state || (tt.detail != "" && got.Detail != tt.detail) {
				t.Errorf("step = %+v, want %s %q", got, tt.state, tt.detail)
			}
			if r.OK != tt.ok || !strings.Contains(r.Error, tt.errWant) {
				t.Errorf("ok = %v, error %q; want ok = %v, error containing %q", r.OK, r.Error, tt.ok, tt.errWant)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("check took %v", d)
			}
		})
	}
}

func hostKeyOf(r HostReport) CheckResult { return r.HostKey }
func reachOf(r HostReport) CheckResult   { return r.Reach }
func authOf(r HostReport) CheckResult    { return r.Auth }
func gtrainOf(r HostReport) CheckResult  { return r.Gtrain }
func gpuOf(r HostReport) CheckResult     { return r.GPU }

// fakeNvidiaSMI puts an nvidia-smi running body in a new directory and returns it.
func fakeNvidiaSMI(t *testing.T, body string) string {
	dir := t.TempDir()
	writeScript(t, dir, "nvidia-smi", body)
	return dir
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func requireBash(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("the master check uses bash's /dev/tcp: no bash here")
	}
}

// TestHostCheckCachedGtrain: without --remote-gtrain, the check looks where
// a run would copy this binary, and runs what it finds there.
func TestHostCheckCachedGtrain(t *testing.T) {
	home := t.TempDir()
	srv := startSSHServer(t, "HOME="+home)
	hc := checker(t, srv)
	hc.SSH.Config.RemoteGtrain = ""
	_, hash, err := hc.SSH.self()
	if err != nil {
		t.Fatal(err)
	}
	path := writeScript(t, filepath.Join(home, ".cache", "gtrain"), "gtrain-"+hash[:16], `echo "gtrain v9.9.9"`)
	r := hc.Check(t.Context(), []Host{remoteHost(srv, 0)})[0]
	if !r.OK || r.GtrainPath != path || r.GtrainVersion != "v9.9.9" {
		t.Errorf("report %+v; want ready with gtrain v9.9.9 at %s", r, path)
	}
}

// TestHostCheckMaster: a host that cannot reach node 0 fails the master
// check; with node 0 on this machine, the others reach it at the address
// they see this machine at.
func TestHostCheckMaster(t *testing.T) {
	requireBash(t)
	t.Run("node 0 unreachable", func(t *testing.T) {
		srv := checkServer(t)
		hc := checker(t, srv)
		dead := Host{Name: "127.0.0.1", Addr: closedPort(t), Node: 0}
		reports := hc.Check(t.Context(), []Host{dead, remoteHost(srv, 1)})
		r := reports[1]
		if r.Master.State != CheckFailed || r.Master.Detail != "refused" || r.MasterAddr != dead.Addr || r.OK {
			t.Errorf("node 1: master %+v at %q, ok %v; want refused at %s, not ok", r.Master, r.MasterAddr, r.OK, dead.Addr)
		}
		if !strings.Contains(r.Error, "reaching the master at "+dead.Addr) {
			t.Errorf("node 1 error %q does not name the master", r.Error)
		}
	})
	t.Run("node 0 local", func(t *testing.T) {
		srv := checkServer(t)
		hc := checker(t, srv)
		local := Host{Name: "localhost", Node: 0, Local: true}
		reports := hc.Check(t.Context(), []Host{local, remoteHost(srv, 1)})
		l, r := reports[0], reports[1]
		if !l.OK || l.Reach.Detail != "local" || l.GtrainVersion != "v1.0.0-local" || l.CPUs < 1 {
			t.Errorf("local node 0: %+v", l)
		}
		if !r.OK || r.Master.State != CheckOK || !strings.HasPrefix(r.MasterAddr, "127.0.0.1:") {
			t.Errorf("node 1: %+v; want master reached on 127.0.0.1", r)
		}
	})
}

// TestHostCheckHandshakeTimeout: a port that accepts but never speaks SSH
// fails within the timeout, as a handshake that timed out.
func TestHostCheckHandshakeTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	srv := checkServer(t)
	hc := checker(t, srv)
	hc.SSH.Config.ConnectTimeout = 500 * time.Millisecond
	start := time.Now()
	r := hc.Check(t.Context(), []Host{{Name: "127.0.0.1", Addr: l.Addr().String()}})[0]
	if r.Reach.State != CheckOK || r.Auth.State != CheckFailed || r.Auth.Detail != "timed out" {
		t.Errorf("reach %+v, auth %+v; want ok and timed out", r.Reach, r.Auth)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v with a 500ms timeout", d)
	}
}

package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/launch"
)

// TestHostsCheckMultiHost runs `gtrain hosts check` against real sshd hosts
// (internal/netns): both ready; then host 0 cut off (its row and host 1's
// master check time out); then host 1 with a new host key.
func TestHostsCheckMultiHost(t *testing.T) {
	c := netns.New(t, 2)
	// timeout is --ssh-timeout, which bounds each check on a host: 6s where
	// some checks are meant to time out (and host 1's own must still pass),
	// 20s where all must answer (a loaded CI machine once took over 3s to
	// run `uname -sm; nproc` over SSH).
	args := func(timeout string, extra ...string) []string {
		return append([]string{"hosts", "check", "--hostfile", c.Hostfile(1),
			"--identity", c.IdentityFile, "--ssh-known-hosts", c.KnownHosts, "--ssh-config", "none",
			"--remote-gtrain", gtrainBin(t), "--ssh-timeout", timeout}, extra...)
	}
	row := func(i int, rest string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(c.Hosts[i].IP) + ` +` + rest + `$`)
	}

	code, out, stderr := runGtrain(t, 60*time.Second, args("20s")...)
	if code != ExitOK {
		t.Fatalf("all ready: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	// GPUs: detection by the host's gtrain (hosts detect); these hosts have
	// no NVIDIA driver.
	ready := `ok +ok +ok +` + regexp.QuoteMeta(scriptVersion) + ` +Linux \S+ +[1-9][0-9]* +0 \(no driver\) +`
	for i, master := range []string{"master", "ok"} {
		if !row(i, ready+master).MatchString(out) {
			t.Errorf("host %d's row is not ready:\n%s", i, out)
		}
	}
	if !strings.HasSuffix(out, "\n2 of 2 hosts ready\n") {
		t.Errorf("no final line \"2 of 2 hosts ready\":\n%s", out)
	}
	for _, h := range c.Hosts {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(h.IP) + `:\n  cpu: [1-9]`).MatchString(out) {
			t.Errorf("no hardware of %s (its gtrain's hosts detect):\n%s", h.IP, out)
		}
	}

	code, out, _ = runGtrain(t, 60*time.Second, args("20s", "-o", "json")...)
	var doc struct{ Hosts []launch.HostReport }
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != ExitOK || len(doc.Hosts) != 2 {
		t.Fatalf("json: exit %d, %v, %d hosts:\n%s", code, err, len(doc.Hosts), out)
	}
	if h := doc.Hosts[1]; h.Facts == nil || h.Facts.CPU.Threads == 0 || h.Facts.GPUError == "" {
		t.Errorf("json host 1: facts %+v: want its CPUs and why it has no GPUs", h.Facts)
	}
	if h := doc.Hosts[1]; !h.OK || h.MasterAddr != c.Hosts[0].IP+":22" || h.GtrainVersion != scriptVersion {
		t.Errorf("json host 1: ok %v, master_addr %q, gtrain %q; want true, %s:22, %s", h.OK, h.MasterAddr, h.GtrainVersion, c.Hosts[0].IP, scriptVersion)
	}

	c.Cut(0)
	start := time.Now()
	code, out, stderr = runGtrain(t, 60*time.Second, args("6s")...)
	c.Restore(0)
	if code != ExitFailure {
		t.Errorf("host 0 cut: exit %d, want %d\n%s\n%s", code, ExitFailure, out, stderr)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("host 0 cut: took %v, want about two 6s timeouts", d)
	}
	if !row(0, `FAIL: timed out +- +- +- +- +- +- +master`).MatchString(out) ||
		!row(1, ready+`FAIL: (timed out|no route)`).MatchString(out) ||
		!strings.Contains(out, "(timed out: is the host up and reachable from here?)") ||
		!strings.HasSuffix(out, "\n0 of 2 hosts ready\n") {
		t.Errorf("host 0 cut: want host 0 timed out and host 1 unable to reach it:\n%s", out)
	}

	c.RotateHostKey(1)
	code, out, stderr = runGtrain(t, 60*time.Second, args("20s")...)
	if code != ExitFailure {
		t.Errorf("host 1 key rotated: exit %d, want %d\n%s\n%s", code, ExitFailure, out, stderr)
	}
	if !row(0, ready+"master").MatchString(out) || !row(1, `ok +- +FAIL: changed key +- +- +- +- +-`).MatchString(out) ||
		!strings.Contains(out, "host key of "+c.Hosts[1].IP+" CHANGED") || !strings.HasSuffix(out, "\n1 of 2 hosts ready\n") {
		t.Errorf("host 1 key rotated: want host 1's changed key named:\n%s", out)
	}
}

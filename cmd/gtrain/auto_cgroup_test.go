package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/internal/proctest"
)

// memCgroup is a memory cgroup a test made, with a limit that the kernel
// enforces on the processes the test moves in and that their detection
// reads: in cgroup v1's memory hierarchy a child of the test's own cgroup,
// in v2 a child of the root (v2 gives a child the memory controller only
// where its parent runs no process, which the root may).
type memCgroup struct {
	dir    string // the cgroup's directory
	parent string // its parent's, where processes go back at cleanup
	hier   string // where its hierarchy is mounted: /sys/fs/cgroup/memory (v1) or /sys/fs/cgroup (v2)
	v2     bool
}

// newMemCgroup makes a memory cgroup of limit bytes, removed when t ends
// (after the network-namespace hosts made later, whose processes it may
// hold). Where none can be made it skips t, or fails it where the netns
// tier is required (GTRAIN_REQUIRE_NETNS=1 or CI).
func newMemCgroup(t *testing.T, limit int64) *memCgroup {
	t.Helper()
	netns.Require(t) // Linux and root, as the hosts need
	cg, err := makeMemCgroup(t.Name(), limit)
	if err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_NETNS", fmt.Errorf("cgroup: cannot make a memory cgroup to limit a host with: %w", err))
	}
	t.Cleanup(func() {
		if err := cg.remove(); err != nil {
			t.Errorf("cgroup: %v", err)
		}
	})
	return cg
}

// makeMemCgroup makes the cgroup in the hierarchy that holds the memory
// controller, as /proc/self/mountinfo and /proc/self/cgroup show it.
func makeMemCgroup(name string, limit int64) (*memCgroup, error) {
	v1, v2, err := memHierarchies()
	if err != nil {
		return nil, err
	}
	leaf := fmt.Sprintf("gtrain-test-%d-%s", os.Getpid(), regexp.MustCompile(`[^A-Za-z0-9_-]`).ReplaceAllString(name, "_"))
	var cg *memCgroup
	switch {
	case v1 != "":
		own, err := ownCgroup("memory")
		if err != nil {
			return nil, err
		}
		parent := filepath.Join(v1, own)
		cg = &memCgroup{dir: filepath.Join(parent, leaf), parent: parent, hier: v1}
	case v2 != "":
		ctl, err := os.ReadFile(filepath.Join(v2, "cgroup.subtree_control"))
		if err != nil || !strings.Contains(" "+strings.TrimSpace(string(ctl))+" ", " memory ") {
			return nil, fmt.Errorf("%s: the root gives its children no memory controller (cgroup.subtree_control %q)", v2, ctl)
		}
		cg = &memCgroup{dir: filepath.Join(v2, leaf), parent: v2, hier: v2, v2: true}
	default:
		return nil, errors.New("no cgroup hierarchy with the memory controller is mounted")
	}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		return nil, err
	}
	file := "memory.limit_in_bytes"
	if cg.v2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(cg.dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		_ = os.Remove(cg.dir)
		return nil, fmt.Errorf("set %s: %w", file, err)
	}
	return cg, nil
}

// memHierarchies are the mount points of cgroup v1's memory hierarchy and
// of v2's, "" where none is mounted.
func memHierarchies() (v1, v2 string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		switch {
		case tail[0] == "cgroup" && strings.Contains(","+tail[2]+",", ",memory,") && v1 == "":
			v1 = fields[4]
		case tail[0] == "cgroup2" && v2 == "":
			v2 = fields[4]
		}
	}
	return v1, v2, sc.Err()
}

// ownCgroup is this process's cgroup in the v1 hierarchy of controller.
func ownCgroup(controller string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ","+controller+",") {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("/proc/self/cgroup names no %s cgroup", controller)
}

// procs is the cgroup's cgroup.procs: a pid written there moves in.
func (cg *memCgroup) procs() string { return filepath.Join(cg.dir, "cgroup.procs") }

// confine puts host i of c into the cgroup, as a host whose agent runs
// under a memory limit: its sshd moves in (so every session, agent and
// rank it starts from now on is in it), and the hierarchy is mounted in
// that sshd's mount namespace. That namespace is `ip netns exec`'s, which
// remounts /sys for the network namespace and so shows no cgroup file
// system: without the mount the host's processes are limited but cannot
// see it, as in a container that mounts no cgroups.
func (cg *memCgroup) confine(t *testing.T, c *netns.Cluster, i int) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "ip", "netns", "pids", c.Hosts[i].NS).Output()
	pids := strings.Fields(string(out))
	if err != nil || len(pids) == 0 {
		t.Fatalf("cgroup: the processes of host %d (%s): %v %q", i, c.Hosts[i].NS, err, out)
	}
	live := ""
	for _, pid := range pids {
		if err := os.WriteFile(cg.procs(), []byte(pid), 0o644); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue // exited since it was listed (what the last job left ending): nothing to confine
			}
			t.Fatalf("cgroup: move host %d's process %s into %s: %v", i, pid, cg.dir, err)
		}
		if live == "" {
			live = pid
		}
	}
	if live == "" {
		t.Fatalf("cgroup: every process of host %d (%s) exited before it could be moved", i, c.Hosts[i].NS)
	}
	mount := fmt.Sprintf("mount -t tmpfs gtrain-test /sys/fs/cgroup && mkdir -p %[1]s && mount -t cgroup -o memory gtrain-test %[1]s", cg.hier)
	if cg.v2 {
		mount = fmt.Sprintf("mount -t cgroup2 gtrain-test %s", cg.hier)
	}
	if !strings.HasPrefix(cg.hier, "/sys/fs/cgroup") {
		t.Fatalf("cgroup: the memory hierarchy is mounted at %s, not below /sys/fs/cgroup, where a host's detection looks", cg.hier)
	}
	if out, err := exec.CommandContext(t.Context(), "nsenter", "-t", live, "-m", "--", "sh", "-c", mount).CombinedOutput(); err != nil {
		t.Fatalf("cgroup: mount the memory hierarchy in host %d's mount namespace: %v\n%s", i, err, out)
	}
}

// peak is the most memory the cgroup's processes held together (0 when
// the kernel does not say).
func (cg *memCgroup) peak() int64 {
	file := "memory.max_usage_in_bytes"
	if cg.v2 {
		file = "memory.peak"
	}
	b, _ := os.ReadFile(filepath.Join(cg.dir, file))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// remove moves whatever still runs in the cgroup back to its parent and
// removes it, waiting a little for processes that are exiting.
func (cg *memCgroup) remove() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(cg.procs())
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(cg.parent, "cgroup.procs"), []byte(pid), 0o644) // gone already: fine
		}
		err := os.Remove(cg.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s left behind: %w", cg.dir, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

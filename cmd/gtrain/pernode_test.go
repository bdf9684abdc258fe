package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
)

// Per-node mode over the network-namespace hosts: `gtrain run` started
// once inside every host (ip netns exec), no hostfile and no SSH; the
// nodes meet at the c10d rendezvous that host 0 serves.

// testSecret is the job secret of the per-node tests.
const testSecret = "per-node-test-secret-0123456789"

// node is one `gtrain run` of a per-node job.
type node struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	err  lockedBuffer
	done chan error
}

// startNode starts gtrain run with args inside host i (or on this machine
// when c is nil), with the job secret in the environment.
func startNode(t *testing.T, c *netns.Cluster, i int, secret string, args ...string) *node {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute) // a backstop
	t.Cleanup(cancel)
	n := &node{done: make(chan error, 1)}
	if c != nil {
		n.cmd = c.Exec(ctx, i, gtrainBin(t), args...)
	} else {
		n.cmd = exec.CommandContext(ctx, gtrainBin(t), args...)
	}
	n.cmd.Env = append(os.Environ(), "NO_COLOR=1", "GTRAIN_RDZV_SECRET="+secret)
	n.cmd.Stdout, n.cmd.Stderr = &n.out, &n.err
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.done <- n.cmd.Wait() }()
	return n
}

// wait waits for the node's gtrain to exit and returns its exit code.
func (n *node) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case err := <-n.done:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(within):
		t.Fatalf("gtrain %v did not exit within %v\nstderr:\n%s", n.cmd.Args, within, n.err.String())
		return -1
	}
}

// perNodeArgs are the flags of node i of a per-node job of n nodes.
func perNodeArgs(c *netns.Cluster, endpoint, id string, i, nodes int, extra []string, cmd ...string) []string {
	args := []string{"run", "--nnodes", strconv.Itoa(nodes), "--node-rank", "auto", "--rdzv-endpoint", endpoint,
		"--rdzv-id", id, "--local-addr", c.Hosts[i].IP, "--nproc-per-node", "2", "--table", "never",
		"--heartbeat", "1s", "--grace-period", "3s", "--join-timeout", "90s"}
	return append(append(append(args, extra...), "--"), cmd...)
}

// envScript writes each rank's environment to $OUT/rank.$RANK.
const envScript = `env > "$OUT/rank.$RANK.tmp" && mv "$OUT/rank.$RANK.tmp" "$OUT/rank.$RANK"`

// TestPerNodeJob: 3 nodes started independently, in random order and the
// last one late, form one job of 6 ranks; each rank's contract variables
// are those the SSH launcher gives the same job over the same hosts
// (--hostfile), rank by rank.
func TestPerNodeJob(t *testing.T) {
	c := netns.New(t, 3)
	sshDir, perDir := t.TempDir(), t.TempDir()
	code, _, stderr := runGtrain(t, 90*time.Second, runArgs(c, 2, []string{"--env", "OUT=" + sshDir, "--rdzv-id", "same-job"}, "sh", "-c", envScript)...)
	if code != 0 {
		t.Fatalf("gtrain run --hostfile: exit %d\n%s", code, stderr)
	}

	endpoint := c.Hosts[0].IP + ":29400"
	order := rand.Perm(3)
	t.Logf("start order: hosts %v, host %d late", order, order[2])
	nodes := make([]*node, 3)
	for k, i := range order {
		if k == 2 {
			// Late, not synchronisation: the job forms whether or not
			// the others joined meanwhile.
			time.Sleep(2 * time.Second)
		}
		nodes[i] = startNode(t, c, i, testSecret, perNodeArgs(c, endpoint, "same-job", i, 3, []string{"--env", "OUT=" + perDir}, "sh", "-c", envScript)...)
	}
	for i, n := range nodes {
		if code := n.wait(t, 2*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s", i, code, n.err.String())
		}
		if !strings.Contains(n.err.String(), fmt.Sprintf("is node %d of 3 (6 ranks in all", i)) {
			t.Errorf("node %d's stderr does not say it is node %d of 3:\n%s", i, i, n.err.String())
		}
	}
	compareContract(t, sshDir, perDir, 6)
}

// contractSame are the variables that must be equal in both modes;
// contractSet those that must be set in both (their values are paths and
// ports of each run).
var (
	contractSame = []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
		"ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT",
		"TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "GTRAIN_RUN_ID",
		"GTRAIN_HOST", "GTRAIN_SLOT", "GTRAIN_ATTEMPT", "GTRAIN_STATUS_FD", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE",
		"OMP_NUM_THREADS", "OUT"}
	contractSet = []string{"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "GTRAIN_STORE_ADDR", "GTRAIN_STORE_SECRET_FILE"}
)

// compareContract compares every rank's environment of the SSH launcher's
// run (in a) and the per-node run (in b), but OUT, which names each dir.
func compareContract(t *testing.T, a, b string, ranks int) {
	t.Helper()
	masterPort := map[string]bool{}
	for r := range ranks {
		ea := readEnvFile(t, filepath.Join(a, "rank."+strconv.Itoa(r)))
		eb := readEnvFile(t, filepath.Join(b, "rank."+strconv.Itoa(r)))
		for _, k := range contractSame {
			va, vb := ea[k], eb[k]
			if k == "OUT" {
				va, vb = strings.TrimPrefix(va, a), strings.TrimPrefix(vb, b)
			}
			if va != vb {
				t.Errorf("rank %d: %s=%q with --hostfile, %q per node", r, k, va, vb)
			}
		}
		for _, k := range contractSet {
			if ea[k] == "" || eb[k] == "" {
				t.Errorf("rank %d: %s=%q with --hostfile, %q per node: want both set", r, k, ea[k], eb[k])
			}
		}
		masterPort[eb["MASTER_PORT"]] = true
	}
	if len(masterPort) != 1 {
		t.Errorf("per node, the ranks got MASTER_PORTs %v: want one", masterPort)
	}
}

// TestPerNodeRankFailure: a rank failing on one node stops every node:
// the failing node exits with the rank's code, the others with 1, naming
// the node and the rank.
func TestPerNodeRankFailure(t *testing.T) {
	c := netns.New(t, 2)
	endpoint := c.Hosts[0].IP + ":29400"
	script := `if [ "$RANK" = 3 ]; then exit 7; fi; exec sleep 600`
	nodes := []*node{
		startNode(t, c, 0, testSecret, perNodeArgs(c, endpoint, "fail-job", 0, 2, nil, "sh", "-c", script)...),
		startNode(t, c, 1, testSecret, perNodeArgs(c, endpoint, "fail-job", 1, 2, nil, "sh", "-c", script)...),
	}
	if code := nodes[1].wait(t, time.Minute); code != 7 {
		t.Errorf("node 1 (rank 3 failed there): exit %d, want 7\n%s", code, nodes[1].err.String())
	}
	if code := nodes[0].wait(t, time.Minute); code != 1 {
		t.Errorf("node 0: exit %d, want 1\n%s", code, nodes[0].err.String())
	}
	if s := nodes[0].err.String(); !strings.Contains(s, "node "+c.Hosts[1].IP+" stopped the job: rank 3 (local rank 1) exited with code 7") {
		t.Errorf("node 0's stderr does not name node %s and rank 3:\n%s", c.Hosts[1].IP, s)
	}
}

// TestPerNodeWrongSecret: a node with another secret than the node
// hosting the rendezvous is refused, saying so; one without any secret
// does not start.
func TestPerNodeWrongSecret(t *testing.T) {
	c := netns.New(t, 2)
	endpoint := c.Hosts[0].IP + ":29400"
	host := startNode(t, c, 0, testSecret, perNodeArgs(c, endpoint, "secret-job", 0, 2, nil, "true")...)
	wrong := startNode(t, c, 1, "another-secret-of-16+bytes", perNodeArgs(c, endpoint, "secret-job", 1, 2, nil, "true")...)
	if code := wrong.wait(t, time.Minute); code == 0 || !strings.Contains(wrong.err.String(), "job secret differs") {
		t.Errorf("the node with a wrong secret: exit %d, want it refused naming the secret:\n%s", code, wrong.err.String())
	}
	_ = host.cmd.Process.Kill()
	host.wait(t, time.Minute)

	none := startNode(t, c, 1, "", perNodeArgs(c, endpoint, "secret-job", 1, 2, nil, "true")...)
	if code := none.wait(t, time.Minute); code != 2 || !strings.Contains(none.err.String(), "needs the job secret") {
		t.Errorf("a node without a secret: exit %d, want 2 and a message saying it needs one:\n%s", code, none.err.String())
	}
}

// TestPerNodeRestart: a rank failing in the first attempt restarts the
// job on every node together (--max-restarts counts job-wide): both
// nodes run attempt 1, with a new MASTER_PORT, and exit 0. Both nodes run
// on this machine: the first to bind the endpoint hosts the rendezvous.
func TestPerNodeRestart(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	script := `if [ "$RANK" = 3 ] && mkdir "$OUT/failed" 2>/dev/null; then exit 7; fi; echo "attempt $TORCHELASTIC_RESTART_COUNT port $MASTER_PORT"`
	var nodes []*node
	for i := range 2 {
		nodes = append(nodes, startNode(t, nil, i, testSecret, "run", "--nnodes", "2", "--rdzv-endpoint", endpoint,
			"--rdzv-id", "restart-job", "--local-addr", "127.0.0."+strconv.Itoa(i+1), "--nproc-per-node", "2",
			"--table", "never", "--heartbeat", "500ms", "--grace-period", "3s", "--max-restarts", "1",
			"--env", "OUT="+dir, "--", "sh", "-c", script))
	}
	ports := map[string]bool{}
	for i, n := range nodes {
		if code := n.wait(t, 2*time.Minute); code != 0 {
			t.Fatalf("node %d: exit %d\n%s", i, code, n.err.String())
		}
		if !strings.Contains(n.err.String(), "restarting the job") || !strings.Contains(n.err.String(), "attempt 1)") {
			t.Errorf("node %d did not restart with the job:\n%s", i, n.err.String())
		}
		for _, line := range strings.Split(n.out.String(), "\n") {
			if _, p, ok := strings.Cut(line, "attempt 1 port "); ok {
				ports[p] = true
			}
		}
	}
	if len(ports) != 1 {
		t.Errorf("attempt 1's ranks got MASTER_PORTs %v: want one, the same on both nodes", ports)
	}
}

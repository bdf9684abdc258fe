package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/netns"
	"github.com/gtrain/gtrain/launch"
)

// TestMultiHostNprocAuto: --nproc-per-node auto with a hostfile whose
// second host has no slots=, over real SSH: that host's agent reports its
// hardware before the job and the job gives it a rank per CPU its cgroup
// leaves (the hosts are network namespaces of this machine, so its
// count); the first host keeps its one slot and rank 0, as hostfile order
// says.
func TestMultiHostNprocAuto(t *testing.T) {
	c := netns.New(t, 2)
	want, err := launch.CountSlots(launch.DetectHost(t.Context()), launch.NprocAuto)
	if err != nil || want < 1 {
		t.Fatalf("this machine's count: %d, %v", want, err)
	}
	hf := filepath.Join(t.TempDir(), "hostfile")
	text := c.Hosts[0].IP + " slots=1\n" + c.Hosts[1].IP + "\n"
	if err := os.WriteFile(hf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	args := append([]string{"run", "--hostfile", hf, "--nproc-per-node", "auto", "--table", "never", "--env", "OUT=" + dir}, sshArgs(c)...)
	// Two rounds of agents (the count, then the job) on a loaded machine:
	// a slower heartbeat than sshArgs' keeps a busy agent from counting lost.
	args = append(args, "--heartbeat", "3s")
	script := `echo "$GTRAIN_HOST $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE" > "$OUT/rank.$RANK"`
	code, _, stderr := runGtrain(t, 180*time.Second, append(args, "--", "sh", "-c", script)...)
	if code != 0 {
		t.Fatalf("gtrain exit %d\n%s", code, stderr)
	}
	world := strconv.Itoa(1 + want)
	for rank := range 1 + want {
		b, err := os.ReadFile(filepath.Join(dir, "rank."+strconv.Itoa(rank)))
		if err != nil {
			t.Fatalf("rank %d of %s did not run: %v\n%s", rank, world, err, stderr)
		}
		host, local, lws := c.Hosts[1].IP, strconv.Itoa(rank-1), strconv.Itoa(want)
		if rank == 0 {
			host, local, lws = c.Hosts[0].IP, "0", "1"
		}
		if got, w := string(b), host+" "+local+" "+lws+" "+world+"\n"; got != w {
			t.Errorf("rank %d: %q, want %q", rank, got, w)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "rank."+world)); err == nil {
		t.Errorf("a rank %s ran: want %s ranks in all", world, world)
	}
}

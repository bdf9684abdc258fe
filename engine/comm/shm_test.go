//go:build linux

package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// tpSHM returns a maker of SHM transports with segments in dir.
func tpSHM(store Store, dir string, size, ring int) func(rank int) (Transport, error) {
	return func(rank int) (Transport, error) {
		return NewSHM(context.Background(), SHMConfig{Rank: rank, Size: size, Store: store, Prefix: "job/0/shm", Dir: dir, RingBytes: ring})
	}
}

// tpNoLitter fails the test if dir holds any file.
func tpNoLitter(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("file left in the segment directory: %s", e.Name())
	}
}

func TestSHMRoundTrip(t *testing.T) {
	const ring = 16 << 10
	sizes := []int{0, 1, 4095, ring, 3*ring + 5, 1<<20 + 7}
	dir := t.TempDir()
	_, links := tpMesh(t, 3, tpSHM(NewMemStore(), dir, 3, ring))
	tpNoLitter(t, dir)
	tpExchange(t, links, sizes)
}

func TestSHMDefaultRing(t *testing.T) {
	dir := t.TempDir()
	_, links := tpMesh(t, 2, tpSHM(NewMemStore(), dir, 2, 0))
	tpExchange(t, links, []int{4095, 4<<20 + 7})
}

func TestSHMLengthMismatch(t *testing.T) {
	a, b := tpPair(t, tpSHM(NewMemStore(), t.TempDir(), 2, 16<<10))
	tpCheckMismatch(t, a, b, []int{10, 100 << 10})
}

func TestSHMCancelUnblocksRecv(t *testing.T) {
	a, b := tpPair(t, tpSHM(NewMemStore(), t.TempDir(), 2, 0))
	tpCheckCancel(t, a, b)
}

func TestSHMPeerClose(t *testing.T) {
	dir := t.TempDir()
	tpCheckClose(t, func() Store { return NewMemStore() }, func(store Store) func(int) (Transport, error) {
		return tpSHM(store, dir, 2, 0)
	})
}

// TestSHMConnectTimeoutNoLitter: a creator whose peer never comes removes
// its segment when its ctx ends, and so does a closed transport.
func TestSHMConnectTimeoutNoLitter(t *testing.T) {
	dir := t.TempDir()
	tr, err := tpSHM(NewMemStore(), dir, 2, 0)(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = tr.Connect(ctx, 1)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect without a peer: %v; want DeadlineExceeded", err)
	}
	time.AfterFunc(50*time.Millisecond, func() { tr.Close() })
	err = tpWithin(t, 2*time.Second, "connect on a closing transport", func() error {
		_, err := tr.Connect(tpCtx(t), 1)
		return err
	})
	if !errors.Is(err, ErrLinkClosed) {
		t.Fatalf("Connect on a closing transport: %v; want ErrLinkClosed", err)
	}
	tpNoLitter(t, dir)
}

const tpChildEnv = "GTRAIN_COMM_TP_SHM_CHILD"

// TestSHMChildPeer is not a test: TestSHMPeerDeath runs the test binary
// with it as rank 1, which connects, says "ready" and waits to be killed.
func TestSHMChildPeer(t *testing.T) {
	dir := os.Getenv(tpChildEnv)
	if dir == "" {
		t.Skip("helper process for TestSHMPeerDeath")
	}
	ctx := tpCtx(t)
	tr, err := tpSHM(tpFileStore{filepath.Join(dir, "store")}, filepath.Join(dir, "shm"), 2, 16<<10)(1)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tr.Connect(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(ctx, []byte("ready")); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
}

// TestSHMPeerDeath SIGKILLs a peer process while this one waits on it in
// Recv and in Send (ring full): both must fail with ErrPeerGone naming
// the peer, within 2 s, and no segment file may be left.
func TestSHMPeerDeath(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"store", "shm"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSHMChildPeer$", "-test.count=1")
	cmd.Env = append(os.Environ(), tpChildEnv+"="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	ctx := tpCtx(t)
	tr, err := tpSHM(tpFileStore{filepath.Join(dir, "store")}, filepath.Join(dir, "shm"), 2, 16<<10)(0)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := tr.Connect(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Recv(ctx, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	tpNoLitter(t, filepath.Join(dir, "shm"))
	// Kill without reaping: the peer stays a zombie, which must count as dead.
	time.AfterFunc(100*time.Millisecond, func() { cmd.Process.Kill() })
	var wg sync.WaitGroup
	for _, op := range []string{"recv", "send"} {
		wg.Go(func() { tpCheckPeerGone(t, c, op, cmd.Process.Pid) })
	}
	wg.Wait()
}

func tpCheckPeerGone(t *testing.T, c Conn, op string, pid int) {
	err := tpWithin(t, 2*time.Second, op+" to a killed peer", func() error {
		if op == "recv" {
			return c.Recv(tpCtx(t), make([]byte, 8))
		}
		return c.Send(tpCtx(t), make([]byte, 64<<10))
	})
	if !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), fmt.Sprint("pid ", pid)) {
		t.Errorf("%s: %v; want ErrPeerGone naming rank 1 and pid %d", op, err, pid)
	}
}

func TestSHMGroups(t *testing.T) {
	dir := t.TempDir()
	mk := tpSHM(NewMemStore(), dir, 3, 64<<10)
	ts := make([]Transport, 3)
	for r := range ts {
		tr, err := mk(r)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		ts[r] = tr
	}
	tpCheckGroups(t, ts)
	tpNoLitter(t, dir)
}

// TestSHMNapPollIsShort checks that the nap of an idle progress loop is
// about shmPollNap, not the millisecond that time.Sleep rounds a short
// sleep up to: two napping ranks would otherwise hand each other a chunk
// per millisecond. The median of 21 naps must be under 700 µs: nanosleep
// wakes within about 100 µs here even at load 15, while time.Sleep(50µs)
// never took less than 1.02 ms.
func TestSHMNapPollIsShort(t *testing.T) {
	naps := make([]time.Duration, 21)
	for i := range naps {
		start := time.Now()
		shmNapPoll()
		naps[i] = time.Since(start)
	}
	slices.Sort(naps)
	if med := naps[len(naps)/2]; med >= 700*time.Microsecond {
		t.Fatalf("median nap %v, want about %v (naps %v)", med, shmPollNap, naps)
	}
}

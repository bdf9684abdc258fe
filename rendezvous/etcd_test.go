package rendezvous

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gtrain/gtrain/internal/etcdtest"
)

// etcdJob is a job's view of an etcd rendezvous: its config, its secret and
// the launcher's client, which has written the expected nodes.
type etcdJob struct {
	srv      *etcdtest.Server
	cfg      EtcdConfig
	secret   []byte
	launcher *EtcdClient
}

func newEtcdJob(t *testing.T, srv *etcdtest.Server, ttl time.Duration, nodes ...string) *etcdJob {
	j := &etcdJob{srv: srv, secret: mustSecret(t),
		cfg: EtcdConfig{Endpoints: []string{srv.Endpoint}, Prefix: EtcdPrefix("run-1", 0), TTL: ttl}}
	j.launcher = j.open(t, j.secret)
	if err := j.launcher.Expect(etcdtest.WaitContext(t), nodes); err != nil {
		t.Fatal(err)
	}
	return j
}

func (j *etcdJob) open(t *testing.T, secret []byte) *EtcdClient {
	t.Helper()
	c, err := OpenEtcd(etcdtest.WaitContext(t), j.cfg, secret)
	if err != nil {
		t.Fatalf("%v\netcd's log:\n%s", err, j.srv.Log())
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// joinAll joins every node, each on its own client, and waits for the
// round.
func (j *etcdJob) joinAll(t *testing.T, nodes ...string) map[string]*EtcdClient {
	cs := map[string]*EtcdClient{}
	errs := make(chan error, len(nodes))
	for _, n := range nodes {
		c := j.open(t, j.secret)
		cs[n] = c
		go func() {
			_, err := c.Join(etcdtest.WaitContext(t), n, Facts{Hostname: n})
			errs <- err
		}()
	}
	for range nodes {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j.launcher.WaitRound(etcdtest.WaitContext(t)); err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestEtcdLeaseExpiryNamesLostNode: a node that stops keeping its lease
// alive (as a crashed or cut-off node does) is reported lost, by name, to
// the launcher and to the other nodes; a clean Close is not a loss of its
// own lease.
func TestEtcdLeaseExpiryNamesLostNode(t *testing.T) {
	j := newEtcdJob(t, etcdtest.Start(t), 2*time.Second, "node-a", "node-b")
	cs := j.joinAll(t, "node-a", "node-b")
	lost := make(chan error, 2)
	go func() { lost <- j.launcher.Watch(etcdtest.WaitContext(t)) }()
	go func() { lost <- cs["node-a"].Watch(etcdtest.WaitContext(t)) }()
	cs["node-b"].cancel() // its keepalive stops; nothing revokes the lease
	for _, who := range []string{"launcher", "node-a"} {
		err := <-lost
		var le *LostError
		if !errors.As(err, &le) || le.Node != "node-b" || !strings.Contains(err.Error(), "node node-b lost: its lease ended") {
			t.Errorf("%s's Watch = %v, want node-b lost", who, err)
		}
	}
}

// TestEtcdRoundSeenAfterNodesLeft: agents close their client (revoking
// their lease, so their member keys go) as soon as their Join returns; a
// launcher that only then looks at the round must still see it closed
// with every node, and so must a node slower than the others.
func TestEtcdRoundSeenAfterNodesLeft(t *testing.T) {
	j := newEtcdJob(t, etcdtest.Start(t), 0, "node-a", "node-b")
	ctx := etcdtest.WaitContext(t)
	a, b := j.open(t, j.secret), j.open(t, j.secret)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Join(ctx, "node-a", Facts{})
		a.Close()
		aDone <- err
	}()
	waitMemberKeys(t, j.launcher, 1)
	// node-b joins last; node-a returns and leaves at once, maybe before
	// node-b's Join has looked at the members.
	if _, err := b.Join(ctx, "node-b", Facts{}); err != nil {
		t.Fatalf("the last node's Join: %v", err)
	}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	b.Close()
	waitMemberKeys(t, j.launcher, 0) // both left before the launcher looks
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	members, err := j.launcher.WaitRound(wctx)
	if err != nil || len(members) != 2 || members[0].Name != "node-a" || members[1].Name != "node-b" {
		t.Errorf("WaitRound after every node left = %+v, %v; want the round as it closed", members, err)
	}
}

// waitMemberKeys waits, with a watch, until the round has n member keys.
func waitMemberKeys(t *testing.T, c *EtcdClient, n int) {
	t.Helper()
	ctx := etcdtest.WaitContext(t)
	for {
		resp, err := c.cli.Get(ctx, c.membersKey(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == int64(n) {
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		<-c.cli.Watch(wctx, c.membersKey(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		cancel()
	}
}

// TestEtcdWrongSecret: a client with another secret on the same run id (a
// second job, or a wrong secret) reads no value as valid and cannot take
// over the round.
func TestEtcdWrongSecret(t *testing.T) {
	j := newEtcdJob(t, etcdtest.Start(t), 0, "node-a")
	if err := j.launcher.Set(bg, "addr/0", []byte("10.0.0.1:1")); err != nil {
		t.Fatal(err)
	}
	other := j.open(t, mustSecret(t))
	_, err := other.Get(bg, "addr/0")
	want := `rendezvous: etcd ` + j.srv.Endpoint + ` key "/gtrain/run-1/0/kv/addr/0": value not signed with this job's secret`
	if !errors.Is(err, ErrAuth) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Get with another secret = %v, want %q", err, want)
	}
	if _, err := other.Add(bg, "addr/0", 1); !errors.Is(err, ErrAuth) {
		t.Errorf("Add with another secret = %v", err)
	}
	if _, err := other.Join(bg, "node-a", Facts{}); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "/round/nodes") {
		t.Errorf("Join with another secret = %v", err)
	}
	if err := other.Expect(bg, []string{"node-x"}); err == nil || !strings.Contains(err.Error(), "run id in use by another job") {
		t.Errorf("Expect by another job = %v", err)
	}
	if v, err := j.launcher.Get(bg, "addr/0"); err != nil || string(v) != "10.0.0.1:1" {
		t.Errorf("the job's own Get = %q, %v", v, err)
	}
}

// TestEtcdRestart: etcd restarted mid-job (stopped, then started on its
// data) is survived: a request while it is down fails by its context,
// naming the key; a Get waiting across it gets the value set after it,
// the counter and a barrier go on, and no node's lease is lost.
func TestEtcdRestart(t *testing.T) {
	srv := etcdtest.Start(t)
	j := newEtcdJob(t, srv, 5*time.Second, "node-a", "node-b")
	cs := j.joinAll(t, "node-a", "node-b")
	a, b := cs["node-a"], cs["node-b"]
	if n, err := a.Add(bg, "count", 1); err != nil || n != 1 {
		t.Fatalf("Add = %d, %v", n, err)
	}
	got := make(chan string, 1)
	go func() {
		v, err := a.Get(etcdtest.WaitContext(t), "late")
		got <- string(v) + errString(err) // errString(nil) is ""
	}()
	lost := make(chan error, 1)
	wctx, stopWatch := context.WithCancel(bg)
	defer stopWatch()
	go func() { lost <- j.launcher.Watch(wctx) }()

	srv.Stop(t)
	// While etcd is down a request waits for it, and its context ends the
	// wait with an error naming the endpoint and the key.
	dctx, cancel := context.WithTimeout(bg, 500*time.Millisecond)
	defer cancel()
	err := a.Set(dctx, "down", []byte("x"))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rendezvous: etcd "+srv.Endpoint+`: set "down" (key /gtrain/run-1/0/kv/down)`) {
		t.Errorf("Set while etcd is down = %v", err)
	}
	srv.Restart(t)

	ctx := etcdtest.WaitContext(t)
	if err := b.Set(ctx, "late", []byte("after")); err != nil {
		t.Fatalf("Set after the restart: %v", err)
	}
	if g := <-got; g != "after" {
		t.Errorf("Get waiting across the restart = %q, want the value set after it", g)
	}
	if n, err := b.Add(ctx, "count", 1); err != nil || n != 2 {
		t.Errorf("Add after the restart = %d, %v; want 2", n, err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Barrier(ctx, "after-restart", 2) }()
	if err := b.Barrier(ctx, "after-restart", 2); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stopWatch()
	if err := <-lost; !errors.Is(err, context.Canceled) {
		t.Errorf("the launcher's Watch across the restart = %v, want no node lost", err)
	}
}

// TestEtcdUserAuth: with etcd's user auth on, the configured user and
// password are passed through; a wrong password is refused at Open, naming
// the endpoint.
func TestEtcdUserAuth(t *testing.T) {
	srv := etcdtest.Start(t)
	j := newEtcdJob(t, srv, 0, "node-a")
	ctx := etcdtest.WaitContext(t)
	cli := j.launcher.cli
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	pwFile := t.TempDir() + "/pw"
	writeFile(t, pwFile, "rootpw\n")
	cfg := j.cfg
	cfg.Username, cfg.PasswordFile = "root", pwFile
	parsed, err := ParseEtcdEndpoint(cfg.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	c, err := OpenEtcd(ctx, parsed, j.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	cfg.PasswordFile, cfg.Password = "", "wrong"
	if _, err := OpenEtcd(ctx, cfg, j.secret); err == nil || !strings.Contains(err.Error(), "rendezvous: etcd "+srv.Endpoint) || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("Open with a wrong password = %v", err)
	}
}

// TestOpenEtcdUnreachable: no etcd at the endpoint is an error naming it,
// within the context.
func TestOpenEtcdUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(bg, 500*time.Millisecond)
	defer cancel()
	_, err := Open(ctx, "etcd://127.0.0.1:1/gtrain/run/0", mustSecret(t))
	if err == nil || !strings.Contains(err.Error(), "rendezvous: etcd 127.0.0.1:1: connect:") || !strings.Contains(err.Error(), "is etcd running there") {
		t.Errorf("Open of nothing = %v", err)
	}
}

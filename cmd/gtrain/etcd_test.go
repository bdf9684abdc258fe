package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gtrain/gtrain/internal/etcdtest"
)

// runGtrainIn runs the built gtrain in dir and returns its output and error.
func runGtrainIn(t *testing.T, dir string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a backstop
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(scriptBinDir, "gtrain"), args...)
	cmd.Dir = dir
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// TestRunEtcdRendezvous: gtrain run --rdzv-backend etcd runs a job whose
// agents and ranks meet in a real etcd instead of the launcher's server:
// a command's ranks get the etcd endpoint as their store, the built-in
// engine's two ranks bootstrap through it and train, and the attempt's
// keys are gone afterwards.
func TestRunEtcdRendezvous(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	stdout, stderr, err := runGtrainIn(t, dir, "run", "--table", "never", "--nproc-per-node", "2",
		"--rdzv-backend", "etcd", "--rdzv-endpoint", srv.Endpoint, "--rdzv-id", "etcd-cmd",
		"--", "sh", "-c", `echo "store=$GTRAIN_STORE_ADDR"`)
	if err != nil {
		t.Fatalf("gtrain run: %v\n%s\n%s\netcd:\n%s", err, stdout, stderr, srv.Log())
	}
	want := "store=etcd://" + srv.Endpoint + "/gtrain/etcd-cmd/0"
	if strings.Count(stdout, want) != 2 {
		t.Errorf("ranks' output:\n%s\nwant each rank to print %q", stdout, want)
	}

	job := "model: {preset: test}\ndata: {synthetic: 2000}\nbatch: {micro_batch: 2, seq: 32}\nsteps: 2\n" +
		"checkpoint: {dir: ckpt, every: 0}\neval: {every: 0}\nlog_every: 1\n"
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err = runGtrainIn(t, dir, "run", "--table", "never", "--nproc-per-node", "2",
		"--rdzv-backend", "etcd", "--rdzv-endpoint", srv.Endpoint, "--rdzv-id", "etcd-engine", "--job", "job.yaml")
	if err != nil || !strings.Contains(stdout, "[rank 0] step 2/2 | loss ") || !strings.Contains(stdout, "dp 2") {
		t.Fatalf("gtrain run of the engine over etcd: %v\n%s\n%s", err, stdout, stderr)
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(etcdtest.WaitContext(t), "/gtrain/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("keys left in etcd after the jobs: %d, the first %s", len(resp.Kvs), resp.Kvs[0].Key)
	}
}

// TestRunEtcdRefused: a wrong --rdzv-backend or an etcd that is not there
// is an error naming it, not a hang.
func TestRunEtcdRefused(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--rdzv-backend", "zookeeper"}, `--rdzv-backend "zookeeper": want c10d (the default), static or etcd`},
		{[]string{"--rdzv-backend", "etcd"}, "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT"},
		{[]string{"--rdzv-endpoint", "127.0.0.1:2379"}, "--rdzv-endpoint and --rdzv-conf are for --rdzv-backend etcd"},
		{[]string{"--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1"}, "rendezvous: etcd 127.0.0.1:1: connect: "},
	} {
		args := append([]string{"run", "--table", "never"}, tt.args...)
		_, stderr, err := runGtrainIn(t, t.TempDir(), append(args, "--", "true")...)
		if err == nil || !strings.Contains(stderr, tt.want) {
			t.Errorf("gtrain %s: %v\n%s\nwant %q", strings.Join(args, " "), err, stderr, tt.want)
		}
	}
}

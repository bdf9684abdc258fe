package dist

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/rankenv"
	"github.com/gtrain/gtrain/rendezvous"
)

func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := map[string]string{
		"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"GTRAIN_HOST": "worker-1", "GTRAIN_RUN_ID": "job", "GTRAIN_ATTEMPT": "2",
		rankenv.StoreAddr: "10.1.2.3:4711", rankenv.StoreSecretFile: secret, rankenv.CommAddr: "10.9.9.9", rankenv.NoSHM: "1",
	}
	e, err := FromEnv(envMap(good))
	if err != nil {
		t.Fatal(err)
	}
	want := Env{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, Host: "worker-1", RunID: "job", Attempt: 2,
		StoreAddr: "10.1.2.3:4711", Secret: []byte("0123456789abcdef0123"), CommAddr: "10.9.9.9", NoSHM: true}
	if e.Rank != want.Rank || e.WorldSize != want.WorldSize || e.LocalRank != want.LocalRank || e.LocalWorldSize != want.LocalWorldSize ||
		e.Host != want.Host || e.RunID != want.RunID || e.Attempt != want.Attempt || e.StoreAddr != want.StoreAddr ||
		string(e.Secret) != string(want.Secret) || e.CommAddr != want.CommAddr || e.NoSHM != want.NoSHM {
		t.Fatalf("got %+v\nwant %+v", e, want)
	}

	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range good {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "RANK is not set; WORLD_SIZE is not set"},
		{with("RANK", "x"), `RANK="x" is not a number >= 0`},
		{with("WORLD_SIZE", "0"), `WORLD_SIZE="0" is not a number >= 1`},
		{with("RANK", "4"), "RANK 4 is not below WORLD_SIZE 4"},
		{with(rankenv.StoreAddr, ""), rankenv.StoreAddr + " is not set"},
		{with(rankenv.StoreSecretFile, ""), rankenv.StoreSecretFile + " is not set"},
		{with(rankenv.StoreSecretFile, "/nonexistent/secret"), "/nonexistent/secret"},
	} {
		_, err := FromEnv(envMap(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "run it with gtrain run") {
			t.Errorf("%v: error %v, want %q", tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("error is not one line: %q", err)
		}
	}
}

// TestFromEnvSecretBounded: a store secret file over maxSecretFile (a
// sparse file: nothing is written) is refused unread, naming the file and
// the limit; a FIFO without a writer or /dev/zero is refused at once
// instead of blocking the rank or being read without end.
func TestFromEnvSecretBounded(t *testing.T) {
	dir := t.TempDir()
	big, fifo := filepath.Join(dir, "big"), filepath.Join(dir, "fifo")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(maxSecretFile + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, want string }{
		{big, big + ": larger than 64 KiB, the limit for this file"},
		{fifo, fifo + ": not a regular file"},
		{"/dev/zero", "/dev/zero: not a regular file"},
	} {
		env := map[string]string{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
			rankenv.StoreAddr: "127.0.0.1:1", rankenv.StoreSecretFile: tt.path}
		done := make(chan error, 1)
		go func() { _, err := FromEnv(envMap(env)); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), rankenv.StoreSecretFile+": "+tt.want) {
				t.Errorf("FromEnv with the secret in %s: %v, want an error saying %q", tt.path, err, tt.want)
			}
		case <-time.After(30 * time.Second): // a backstop: it must not block at all
			t.Fatalf("FromEnv with the secret in %s blocked", tt.path)
		}
	}
}

// TestInit bootstraps three ranks through a real rendezvous server, over
// shared memory and, with NoSHM, over TCP, and runs an all-reduce.
func TestInit(t *testing.T) {
	for _, noSHM := range []bool{false, true} {
		secret, err := rendezvous.NewSecret()
		if err != nil {
			t.Fatal(err)
		}
		srv, err := rendezvous.Listen(rendezvous.Config{Addr: "127.0.0.1:0", Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		go srv.Serve(ctx)
		const p = 3
		errs := make([]error, p)
		var wg sync.WaitGroup
		for r := range p {
			wg.Go(func() {
				env := Env{Rank: r, WorldSize: p, RunID: "t", StoreAddr: srv.Addr().String(), Secret: secret, NoSHM: noSHM}
				w, err := Init(ctx, env, Options{Comm: comm.Options{Timeout: 10 * time.Second}})
				if err != nil {
					errs[r] = err
					return
				}
				defer w.Close()
				if h := w.Hosts(); len(h) != p || h[0] == "" || strings.Contains(h[0], "#") {
					t.Errorf("hosts %q", h)
				}
				if w.Comm.Name() != "world" {
					t.Errorf("name %q", w.Comm.Name())
				}
				buf := comm.F32([]float32{float32(r), 1})
				errs[r] = w.Comm.AllReduce(ctx, buf, comm.Sum)
				if got := buf.Float32s(); errs[r] == nil && (got[0] != 3 || got[1] != 3) {
					t.Errorf("rank %d: all-reduce gave %v", r, got)
				}
			})
		}
		wg.Wait()
		cancel()
		srv.Close()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("noSHM %v: rank %d: %v", noSHM, r, err)
			}
		}
	}
}

func TestInitWrongSecret(t *testing.T) {
	secret, _ := rendezvous.NewSecret()
	srv, err := rendezvous.Listen(rendezvous.Config{Addr: "127.0.0.1:0", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go srv.Serve(context.Background())
	other, _ := rendezvous.NewSecret()
	_, err = Init(context.Background(), Env{Rank: 0, WorldSize: 2, StoreAddr: srv.Addr().String(), Secret: other}, Options{})
	if err == nil || !strings.Contains(err.Error(), "rank 0: reach the job's store") {
		t.Fatalf("wrong secret: %v", err)
	}
}

// TestInitRetriesBusyStore: while the store's handshake slots are all
// taken (connections that never authenticate), a rank is refused as busy;
// Init retries until a slot frees instead of failing the job. The idle
// connections hold their slots until the test closes them, once the
// server has refused Init at least once.
func TestInitRetriesBusyStore(t *testing.T) {
	secret, _ := rendezvous.NewSecret()
	var mu sync.Mutex
	busy := 0
	srv, err := rendezvous.Listen(rendezvous.Config{Addr: "127.0.0.1:0", Secret: secret, HandshakeTimeout: time.Minute,
		Log: func(line string) {
			if strings.Contains(line, "too many connections authenticating") {
				mu.Lock()
				busy++
				mu.Unlock()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go srv.Serve(context.Background())
	refused := func() int { mu.Lock(); defer mu.Unlock(); return busy }
	var idle []net.Conn
	for range 80 { // more than the server authenticates at once
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, nc)
	}
	// The server takes the connections in order: once it has refused one,
	// every slot is held by an idle connection.
	backstop := time.Now().Add(20 * time.Second)
	for refused() == 0 {
		if time.Now().After(backstop) {
			t.Fatal("the server refused none of 80 idle connections (the test's premise)")
		}
		time.Sleep(time.Millisecond)
	}
	before := refused()
	type result struct {
		w   *World
		err error
	}
	done := make(chan result, 1)
	go func() {
		w, err := Init(context.Background(), Env{Rank: 0, WorldSize: 1, StoreAddr: srv.Addr().String(), Secret: secret}, Options{})
		done <- result{w, err}
	}()
	for refused() == before {
		select {
		case r := <-done:
			t.Fatalf("Init finished (%v) while every slot was held", r.err)
		default:
		}
		if time.Now().After(backstop) {
			t.Fatal("Init was not refused within 20s while every slot was held")
		}
		time.Sleep(time.Millisecond)
	}
	for _, nc := range idle {
		nc.Close()
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Init with a busy store: %v", r.err)
	}
	r.w.Close()
}

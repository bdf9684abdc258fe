//go:build fanoutbench

package fanoutbench

import (
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/gtrain/gtrain/internal/netns"
)

// handshakeSample is the cost, in this process, of what the launcher does
// first for every host: TCP connect, SSH key exchange, host key check and
// public-key login, with the same x/crypto/ssh client, keys and algorithms.
type handshakeSample struct {
	wall              time.Duration // every host at once, start to the last login
	cpu               time.Duration // this process's user+system CPU for all of them
	heapPerConn       float64       // heap in use per open connection, bytes
	goroutinesPerConn float64       // goroutines per open connection
}

// handshakes logs in to every host of c at once and keeps the connections
// open until it has measured what they hold.
func handshakes(t *testing.T, c *netns.Cluster) handshakeSample {
	t.Helper()
	cfg := clientConfig(t, c)
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()
	cpu0 := selfCPU()
	start := time.Now()
	clients := make([]*ssh.Client, len(c.Hosts))
	errs := make([]error, len(c.Hosts))
	var wg sync.WaitGroup
	for i, h := range c.Hosts {
		wg.Go(func() { clients[i], errs[i] = ssh.Dial("tcp", net.JoinHostPort(h.IP, "22"), cfg) })
	}
	wg.Wait()
	s := handshakeSample{wall: time.Since(start), cpu: selfCPU() - cpu0}
	defer func() {
		for _, cl := range clients {
			if cl != nil {
				cl.Close()
			}
		}
	}()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fanoutbench: ssh to %s: %v", c.Hosts[i].IP, err)
		}
	}
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	n := float64(len(c.Hosts))
	s.heapPerConn = float64(int64(m1.HeapInuse)-int64(m0.HeapInuse)) / n
	s.goroutinesPerConn = float64(runtime.NumGoroutine()-g0) / n
	return s
}

// clientConfig is the launcher's: the cluster's ed25519 key, its
// known_hosts, host keys restricted to ed25519 (the stored type).
func clientConfig(t *testing.T, c *netns.Cluster) *ssh.ClientConfig {
	t.Helper()
	key, err := os.ReadFile(c.IdentityFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := knownhosts.New(c.KnownHosts)
	if err != nil {
		t.Fatal(err)
	}
	return &ssh.ClientConfig{User: c.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: cb, HostKeyAlgorithms: []string{ssh.KeyAlgoED25519}, Timeout: time.Minute}
}

// selfCPU is this process's user+system CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

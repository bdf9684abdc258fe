package dist

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/rankenv"
)

// TestFromEnvSpinWait checks GTRAIN_COMM_SPIN_US: unset is the default
// (0 in Env), "0" no spinning (negative), whole microseconds up to
// comm.MaxTCPSpinWait; anything else is refused naming the variable.
func TestFromEnvSpinWait(t *testing.T) {
	env := rankEnvWith(t, rankenv.CommSpinUS)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"unset", 0},
		{"", 0},
		{"0", -1},
		{"1", time.Microsecond},
		{"250", 250 * time.Microsecond},
		{"10000", comm.MaxTCPSpinWait},
	} {
		e, err := FromEnv(env(tc.in))
		if err != nil || e.SpinWait != tc.want {
			t.Errorf("%s=%q: %v, %v; want %v", rankenv.CommSpinUS, tc.in, e.SpinWait, err, tc.want)
		}
	}
	for _, bad := range []string{"10001", "-1", "abc", "1e3", " 5", "50us", strings.Repeat("9", 100)} {
		_, err := FromEnv(env(bad))
		if err == nil || !strings.Contains(err.Error(), rankenv.CommSpinUS+"=") || !strings.Contains(err.Error(), "from 0") ||
			len(err.Error()) > 300 {
			t.Errorf("%s=%q: %v, want it refused naming the variable and the range, briefly", rankenv.CommSpinUS, bad, err)
		}
	}
}

// TestFromEnvCongestion checks GTRAIN_COMM_TCP_CC: unset leaves the
// default, a name the kernel takes is passed on, anything else is refused
// naming the variable.
func TestFromEnvCongestion(t *testing.T) {
	env := rankEnvWith(t, rankenv.CommTCPCC)
	for in, want := range map[string]string{"unset": "", "": "", "system": "system", "reno": "reno"} {
		if e, err := FromEnv(env(in)); err != nil || e.Congestion != want {
			t.Errorf("%s=%q: %q, %v; want %q", rankenv.CommTCPCC, in, e.Congestion, err, want)
		}
	}
	for _, bad := range []string{"nosuchcc", "Reno", strings.Repeat("x", 200)} {
		_, err := FromEnv(env(bad))
		if err == nil || !strings.Contains(err.Error(), rankenv.CommTCPCC) || len(err.Error()) > 300 {
			t.Errorf("%s=%q: %v, want it refused naming the variable, briefly", rankenv.CommTCPCC, bad, err)
		}
	}
}

// TestFromEnvTCPBuf checks GTRAIN_COMM_TCP_BUF: unset and "0" are the
// kernel's autotuning (0 in Env), whole bytes from comm.MinTCPBufSize to
// comm.MaxTCPBufSize are passed on; anything else is refused naming the
// variable and the range.
func TestFromEnvTCPBuf(t *testing.T) {
	env := rankEnvWith(t, rankenv.CommTCPBuf)
	for in, want := range map[string]int{"unset": 0, "": 0, "0": 0, "4096": comm.MinTCPBufSize, "4194304": 4 << 20, "1073741824": comm.MaxTCPBufSize} {
		if e, err := FromEnv(env(in)); err != nil || e.TCPBuf != want {
			t.Errorf("%s=%q: %d, %v; want %d", rankenv.CommTCPBuf, in, e.TCPBuf, err, want)
		}
	}
	for _, bad := range []string{"4095", "1073741825", "-1", "4M", "4 MiB", " 4096", "0x1000", strings.Repeat("9", 100)} {
		_, err := FromEnv(env(bad))
		if err == nil || !strings.Contains(err.Error(), rankenv.CommTCPBuf+"=") || !strings.Contains(err.Error(), "from 4096 to") ||
			len(err.Error()) > 300 {
			t.Errorf("%s=%q: %v, want it refused naming the variable and the range, briefly", rankenv.CommTCPBuf, bad, err)
		}
	}
}

// rankEnvWith returns the environment of rank 0 of 2 with key set to the
// value given ("unset": not set at all).
func rankEnvWith(t *testing.T, key string) func(v string) func(string) string {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123"), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(v string) func(string) string {
		m := map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
			rankenv.StoreAddr: "10.1.2.3:4711", rankenv.StoreSecretFile: secret}
		if v != "unset" {
			m[key] = v
		}
		return envMap(m)
	}
}

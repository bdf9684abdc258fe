package rendezvous

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdEndpointRoundTrip: what the launcher writes for agents and ranks
// reads back the same, a run id with a slash included, and never carries
// the password itself.
func TestEtcdEndpointRoundTrip(t *testing.T) {
	c := EtcdConfig{Endpoints: []string{"10.0.0.1:2379", "[::1]:2379"}, Prefix: EtcdPrefix("team/run 7", 3),
		CACert: "/etc/ca.pem", Cert: "/etc/c.pem", Key: "/etc/k.pem", Username: "gtrain", Password: "hunter2",
		PasswordFile: "/run/pw", TTL: 30 * time.Second}
	ep := c.Endpoint()
	if strings.Contains(ep, "hunter2") {
		t.Fatalf("endpoint %q carries the password", ep)
	}
	if !IsEtcd(ep) || c.Prefix != "/gtrain/team%2Frun%207/3" {
		t.Fatalf("endpoint %q, prefix %q", ep, c.Prefix)
	}
	got, err := ParseEtcdEndpoint(ep)
	c.Password = ""
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Errorf("ParseEtcdEndpoint(%q) = %+v, %v; want %+v", ep, got, err, c)
	}
}

func TestParseEtcdEndpointRefuses(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"127.0.0.1:2379", "does not start with etcd://"},
		{"etcd://127.0.0.1/gtrain/r/0", `host "127.0.0.1" is not HOST:PORT`},
		{"etcd://127.0.0.1:2379/other/r/0", "is not /gtrain/RUN/ATTEMPT"},
		{"etcd://127.0.0.1:2379/gtrain/r/0?ttl=1ms", "ttl"},
		{"etcd://127.0.0.1:2379/gtrain/r/0?ttl=9999h", "ttl"},
		{"etcd://" + strings.Repeat("h:1,", maxEtcdMembers) + "h:1/gtrain/r/0", "at most 64"},
		{"etcd://h:1/gtrain/r/0?%zz", "invalid URL escape"},
	} {
		if _, err := ParseEtcdEndpoint(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "rendezvous: etcd endpoint ") {
			t.Errorf("ParseEtcdEndpoint(%.40q) = %v, want %q", tt.in, err, tt.want)
		}
	}
}

// TestEtcdTLSFiles: the TLS files are read bounded and checked, each error
// naming the file.
func TestEtcdTLSFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir+"/notpem", "hello")
	for _, tt := range []struct {
		c    EtcdConfig
		want string
	}{
		{EtcdConfig{CACert: dir + "/missing"}, "cacert: "},
		{EtcdConfig{CACert: dir + "/notpem"}, "no PEM certificate"},
		{EtcdConfig{CACert: "/dev/zero"}, "/dev/zero"},
		{EtcdConfig{Cert: dir + "/notpem"}, "cert and key go together"},
		{EtcdConfig{Cert: dir + "/notpem", Key: dir + "/notpem"}, "cert " + dir + "/notpem and key"},
	} {
		if _, err := tt.c.tlsConfig(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("tlsConfig(%+v) = %v, want %q", tt.c, err, tt.want)
		}
	}
	if cfg, err := (EtcdConfig{}).tlsConfig(); cfg != nil || err != nil {
		t.Errorf("no TLS files: %v, %v", cfg, err)
	}
}

// FuzzParseEtcdEndpoint: any endpoint string is parsed or refused without
// a panic, and what is accepted writes back to an endpoint that parses to
// the same config.
func FuzzParseEtcdEndpoint(f *testing.F) {
	f.Add("etcd://127.0.0.1:2379/gtrain/run/0")
	f.Add("etcd://a:1,[::1]:2/gtrain/r%2Fx/3?cacert=/c&cert=/d&key=/k&user=u&password_file=/p&ttl=5s")
	f.Add("etcd://h:1/gtrain/?%zz")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseEtcdEndpoint(s)
		if err != nil {
			return
		}
		again, err := ParseEtcdEndpoint(c.Endpoint())
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("%q parsed to %+v, which writes %q, which parses to %+v, %v", s, c, c.Endpoint(), again, err)
		}
	})
}

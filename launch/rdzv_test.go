package launch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/rendezvous"
)

// TestEtcdConfig: --rdzv-backend, --rdzv-endpoint and --rdzv-conf as
// torchrun users write them become the etcd config, and what cannot work
// is a usage error that says what to write instead.
func TestEtcdConfig(t *testing.T) {
	for _, tt := range []struct {
		name                    string
		backend, endpoint, conf string
		want                    *rendezvous.EtcdConfig
		err                     string
	}{
		{name: "default", want: nil},
		{name: "static", backend: "static", want: nil},
		{name: "etcd", backend: "etcd", endpoint: "10.0.0.1:2379",
			want: &rendezvous.EtcdConfig{Endpoints: []string{"10.0.0.1:2379"}}},
		{name: "etcd with urls, TLS, auth and ttl", backend: "etcd", endpoint: "https://e1:2379,https://e2:2379/",
			conf: "protocol=https, cacert=/ca.pem,cert=/c.pem,key=/k.pem,user=gt,password_file=/pw,ttl=30s",
			want: &rendezvous.EtcdConfig{Endpoints: []string{"e1:2379", "e2:2379"}, CACert: "/ca.pem", Cert: "/c.pem",
				Key: "/k.pem", Username: "gt", PasswordFile: "/pw", TTL: 30 * time.Second}},
		{name: "endpoint without etcd", endpoint: "10.0.0.1:2379", err: "are for --rdzv-backend etcd"},
		{name: "etcd-v2", backend: "etcd-v2", err: "use --rdzv-backend etcd, which speaks the v3 API"},
		{name: "unknown backend", backend: "zk", err: `--rdzv-backend "zk": want c10d`},
		{name: "no endpoint", backend: "etcd", err: "needs --rdzv-endpoint"},
		{name: "endpoint without port", backend: "etcd", endpoint: "e1", err: `host "e1" is not HOST:PORT`},
		{name: "unknown conf key", backend: "etcd", endpoint: "e1:1", conf: "read_timeout=60", err: `--rdzv-conf "read_timeout=60": want key=value pairs of protocol, cacert`},
		{name: "https without ca", backend: "etcd", endpoint: "e1:1", conf: "protocol=https", err: "needs cacert=FILE"},
		{name: "user without password", backend: "etcd", endpoint: "e1:1", conf: "user=gt", err: "needs password_file=FILE"},
		{name: "bad ttl", backend: "etcd", endpoint: "e1:1", conf: "ttl=10", err: "ttl=10: not a duration"},
		{name: "ttl out of range", backend: "etcd", endpoint: "e1:1", conf: "ttl=10ms", err: "is not a duration from 1s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &Request{RendezvousBackend: tt.backend, RendezvousEndpoint: tt.endpoint, RendezvousConf: tt.conf}
			got, err := r.etcdConfig()
			var ue *usage.Error
			switch {
			case tt.err != "":
				if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.As(err, &ue) {
					t.Errorf("etcdConfig = %+v, %v; want a usage error with %q", got, err, tt.err)
				}
			case err != nil:
				t.Errorf("etcdConfig: %v", err)
			case (got == nil) != (tt.want == nil) || got != nil && got.Endpoint() != tt.want.Endpoint():
				t.Errorf("etcdConfig = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestRendezvousAddrEtcd: an agent told of an etcd endpoint meets there,
// whatever its SSH session says of the launcher.
func TestRendezvousAddrEtcd(t *testing.T) {
	ep := "etcd://10.0.0.1:2379/gtrain/run/0"
	if got := rendezvousAddr(&proto.Rendezvous{Endpoint: ep, Port: 7}, "10.9.9.9 1 10.0.0.2 22"); got != ep {
		t.Errorf("rendezvousAddr = %q, want the etcd endpoint", got)
	}
}

package rendezvous

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/gtrain/gtrain/internal/userfile"
)

// EtcdConfig says how to reach an etcd cluster and where in it one attempt
// of one job meets. ParseEtcdEndpoint reads it from an endpoint and
// Endpoint writes it back, so that agents and ranks get all of it in one
// string (never the password: only the file that holds it).
type EtcdConfig struct {
	Endpoints []string // HOST:PORT of each etcd member, at least one
	// Prefix holds every key of the attempt: /gtrain/RUN/ATTEMPT.
	Prefix string
	// TLS, as torchrun's rdzv_conf spells it: the CA to check the servers
	// with, and this client's certificate and key. Files, the same path on
	// every host; with CACert the connection uses TLS.
	CACert, Cert, Key string
	// Username and password of etcd's user auth, when the cluster has it.
	// Password is never written into an endpoint; PasswordFile is.
	Username, Password, PasswordFile string
	// TTL is each node's lease: a node silent for this long is lost.
	TTL time.Duration
}

// Bounds of an etcd endpoint.
const (
	DefaultEtcdTTL   = 10 * time.Second
	maxEtcdMembers   = 64
	maxEtcdTTL       = time.Hour
	maxCredFile      = 1 << 20 // a certificate chain or a password
	etcdPrefixPrefix = "/gtrain/"
)

// EtcdPrefix is the prefix of attempt n of run id run: /gtrain/RUN/N.
func EtcdPrefix(run string, attempt int) string {
	return fmt.Sprintf("%s%s/%d", etcdPrefixPrefix, url.PathEscape(run), attempt)
}

// Endpoint writes c as an etcd endpoint for Open.
func (c EtcdConfig) Endpoint() string {
	q := url.Values{}
	for k, v := range map[string]string{"cacert": c.CACert, "cert": c.Cert, "key": c.Key, "user": c.Username, "password_file": c.PasswordFile} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if c.TTL > 0 {
		q.Set("ttl", c.TTL.String())
	}
	s := etcdScheme + strings.Join(c.Endpoints, ",") + c.Prefix
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// ParseEtcdEndpoint reads "etcd://HOST:PORT[,HOST:PORT...]/gtrain/RUN/N
// [?cacert=F&cert=F&key=F&user=U&password_file=F&ttl=D]".
func ParseEtcdEndpoint(s string) (EtcdConfig, error) {
	bad := func(format string, args ...any) (EtcdConfig, error) {
		return EtcdConfig{}, fmt.Errorf("rendezvous: etcd endpoint %q: %s", clip(s), fmt.Sprintf(format, args...))
	}
	rest, ok := strings.CutPrefix(s, etcdScheme)
	if !ok {
		return bad("does not start with %s", etcdScheme)
	}
	hosts, path, _ := strings.Cut(rest, "/")
	// The prefix stays as written: EtcdPrefix escaped the run id in it.
	path, query, _ := strings.Cut(path, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return bad("%v", err)
	}
	c := EtcdConfig{Endpoints: strings.Split(hosts, ","), Prefix: "/" + path}
	if len(c.Endpoints) > maxEtcdMembers {
		return bad("%d hosts, at most %d", len(c.Endpoints), maxEtcdMembers)
	}
	for _, h := range c.Endpoints {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return bad("host %q is not HOST:PORT", clip(h))
		}
	}
	if !strings.HasPrefix(c.Prefix, etcdPrefixPrefix) || len(c.Prefix) > MaxKey {
		return bad("key prefix %q is not %sRUN/ATTEMPT", clip(c.Prefix), etcdPrefixPrefix)
	}
	c.CACert, c.Cert, c.Key = q.Get("cacert"), q.Get("cert"), q.Get("key")
	c.Username, c.PasswordFile = q.Get("user"), q.Get("password_file")
	if v := q.Get("ttl"); v != "" {
		if c.TTL, err = time.ParseDuration(v); err != nil || c.TTL < time.Second || c.TTL > maxEtcdTTL {
			return bad("ttl %q is not a duration from 1s to %v", clip(v), maxEtcdTTL)
		}
	}
	return c, nil
}

// tlsConfig is the client's TLS from the configured files; nil without
// CACert, Cert or Key. Every file is read bounded.
func (c EtcdConfig) tlsConfig() (*tls.Config, error) {
	if c.CACert == "" && c.Cert == "" && c.Key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		pem, err := userfile.ReadRegular(c.CACert, maxCredFile)
		if err != nil {
			return nil, fmt.Errorf("cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("cacert %s: no PEM certificate in it", c.CACert)
		}
	}
	if (c.Cert == "") != (c.Key == "") {
		return nil, fmt.Errorf("cert and key go together: give both or neither")
	}
	if c.Cert != "" {
		cert, err := userfile.ReadRegular(c.Cert, maxCredFile)
		if err != nil {
			return nil, fmt.Errorf("cert: %w", err)
		}
		key, err := userfile.ReadRegular(c.Key, maxCredFile)
		if err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("cert %s and key %s: %w", c.Cert, c.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// password is Password, else the first line of PasswordFile.
func (c EtcdConfig) password() (string, error) {
	if c.Password != "" || c.PasswordFile == "" {
		return c.Password, nil
	}
	b, err := userfile.ReadRegular(c.PasswordFile, maxCredFile)
	if err != nil {
		return "", fmt.Errorf("password_file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSuffix(line, "\r"), nil
}

package rendezvous

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/etcdtest"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, into dir.
func testPKI(t *testing.T, dir string) (ca, serverCert, serverKey, clientCert, clientKey string) {
	t.Helper()
	caKey, caDER := newCert(t, nil, nil, &x509.Certificate{
		Subject: pkix.Name{CommonName: "gtrain test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	sKey, sDER := newCert(t, caCert, caKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "etcd"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	})
	cKey, cDER := newCert(t, caCert, caKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "gtrain"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	})
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})))
		return p
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return write("ca.pem", "CERTIFICATE", caDER),
		write("server.pem", "CERTIFICATE", sDER), write("server-key.pem", "EC PRIVATE KEY", keyDER(sKey)),
		write("client.pem", "CERTIFICATE", cDER), write("client-key.pem", "EC PRIVATE KEY", keyDER(cKey))
}

// newCert makes a key and a certificate of tmpl, signed by parent (self
// if nil).
func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// TestEtcdTLS: against an etcd that serves TLS and requires client
// certificates, the cacert, cert and key of the endpoint are used; without
// the client certificate, or without TLS, Open fails naming the endpoint.
func TestEtcdTLS(t *testing.T) {
	dir := t.TempDir()
	ca, sc, sk, cc, ck := testPKI(t, dir)
	srv := etcdtest.StartTLS(t, &etcdtest.TLS{Cert: sc, Key: sk, CA: ca})
	cfg := EtcdConfig{Endpoints: []string{srv.Endpoint}, Prefix: EtcdPrefix("tls", 0), CACert: ca, Cert: cc, Key: ck}
	secret := mustSecret(t)
	c, err := Open(etcdtest.WaitContext(t), cfg.Endpoint(), secret)
	if err != nil {
		t.Fatalf("%v\netcd:\n%s", err, srv.Log())
	}
	defer c.Close()
	if err := c.Set(bg, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(bg, "k"); err != nil || string(v) != "v" {
		t.Fatalf("Get over TLS = %q, %v", v, err)
	}
	for _, bad := range []EtcdConfig{
		{Endpoints: cfg.Endpoints, Prefix: cfg.Prefix, CACert: ca}, // no client certificate
		{Endpoints: cfg.Endpoints, Prefix: cfg.Prefix},             // no TLS at all
	} {
		ctx, cancel := context.WithTimeout(bg, 2*time.Second)
		_, err := OpenEtcd(ctx, bad, secret)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "rendezvous: etcd "+srv.Endpoint+": connect:") {
			t.Errorf("Open with %+v = %v, want a connect error naming the endpoint", bad, err)
		}
	}
}

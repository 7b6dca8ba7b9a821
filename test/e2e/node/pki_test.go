package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pki is what the node's components authenticate with, made at test time
// in the temp dir with crypto/x509 (nothing secret is committed): one CA,
// the apiserver's serving cert, the kubelet's serving and client certs,
// the apiserver's client cert for the kubelet, an admin client cert for
// kubectl, and the service-account key pair.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	CAFile string
}

// pair is a cert and its key, as files.
type pair struct{ Cert, Key string }

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: dir}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "napitap-node-e2e-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.caKey = key
	p.CAFile = filepath.Join(dir, "ca.crt")
	writePEM(t, p.CAFile, "CERTIFICATE", der)
	return p
}

// serving issues a server cert for these IPs and DNS names.
func (p *pki) serving(t *testing.T, name, cn string, ips []net.IP, dns []string) pair {
	t.Helper()
	return p.issue(t, name, pkix.Name{CommonName: cn}, x509.ExtKeyUsageServerAuth, ips, dns)
}

// client issues a client cert: the CN is the user, the Os its groups.
func (p *pki) client(t *testing.T, name, user string, groups ...string) pair {
	t.Helper()
	return p.issue(t, name, pkix.Name{CommonName: user, Organization: groups}, x509.ExtKeyUsageClientAuth, nil, nil)
}

func (p *pki) issue(t *testing.T, name string, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string) pair {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	out := pair{Cert: filepath.Join(p.dir, name+".crt"), Key: filepath.Join(p.dir, name+".key")}
	writePEM(t, out.Cert, "CERTIFICATE", der)
	writeKey(t, out.Key, key)
	return out
}

// serviceAccountKeys writes the key pair the apiserver signs and checks
// service-account tokens with.
func (p *pki) serviceAccountKeys(t *testing.T) (pub, priv string) {
	t.Helper()
	key := newKey(t)
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv = filepath.Join(p.dir, "sa.pub"), filepath.Join(p.dir, "sa.key")
	writePEM(t, pub, "PUBLIC KEY", pubDER)
	writeKey(t, priv, key)
	return pub, priv
}

// kubeconfig writes a kubeconfig for server with a client cert.
func (p *pki) kubeconfig(t *testing.T, name, server string, client pair) string {
	t.Helper()
	conf := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: napitap-node
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %[3]s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: %[3]s
  context:
    cluster: napitap-node
    user: %[3]s
current-context: %[3]s
`, server, p.CAFile, name, client.Cert, client.Key)
	path := filepath.Join(p.dir, name+".kubeconfig")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writeKey(t *testing.T, path string, key *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "PRIVATE KEY", der)
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

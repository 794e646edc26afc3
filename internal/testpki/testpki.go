// Package testpki makes throwaway certificates for tests: a CA, a server certificate and a client certificate.
//
// It is for tests only. The keys are generated on the spot, kept in memory
// or written unencrypted into a test's directory, and the certificates
// expire within the hour: never use it for real certificates.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA and the two certificates it signed.
type PKI struct {
	// CAs holds the CA certificate only.
	CAs *x509.CertPool
	// Server is a server certificate for the hosts given to New.
	Server tls.Certificate
	// Client is a client certificate.
	Client tls.Certificate

	caDER []byte
}

// New generates a CA, and a server and a client certificate signed by it,
// valid from an hour ago to an hour from now. The server certificate names
// hosts: IP addresses, such as "127.0.0.1", and DNS names.
func New(t testing.TB, hosts ...string) *PKI {
	t.Helper()
	now := time.Now()
	return NewValid(t, now.Add(-time.Hour), now.Add(time.Hour), hosts...)
}

// NewValid is New with the server and client certificates valid from
// notBefore to notAfter (the CA from an hour before the one to an hour
// after the other): an expired or not yet valid certificate, for tests of
// what refuses it.
func NewValid(t testing.TB, notBefore, notAfter time.Time, hosts ...string) *PKI {
	t.Helper()
	caKey := newKey(t)
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rkv test CA"},
		NotBefore: notBefore.Add(-time.Hour), NotAfter: notAfter.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, name string, usage x509.ExtKeyUsage, hosts []string) tls.Certificate {
		key := newKey(t)
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: notBefore, NotAfter: notAfter,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				template.IPAddresses = append(template.IPAddresses, ip)
			} else {
				template.DNSNames = append(template.DNSNames, h)
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	p := &PKI{CAs: x509.NewCertPool(), caDER: caDER}
	p.CAs.AddCert(ca)
	p.Server = issue(2, "server", x509.ExtKeyUsageServerAuth, hosts)
	p.Client = issue(3, "client", x509.ExtKeyUsageClientAuth, nil)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// ServerConfig is a TLS 1.3 server configuration that presents the server
// certificate and requires a client certificate signed by the CA.
func (p *PKI) ServerConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.Server}, ClientCAs: p.CAs,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
}

// ClientConfig is a TLS 1.3 client configuration that trusts the CA only
// and presents the client certificate.
func (p *PKI) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: p.CAs, Certificates: []tls.Certificate{p.Client}, MinVersion: tls.VersionTLS13}
}

// Files are the paths of the PEM files WriteFiles writes.
type Files struct {
	CA                    string // the CA certificate
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// WriteFiles writes the CA certificate, and each certificate with its
// PKCS #8 key, as PEM files into dir.
func (p *PKI) WriteFiles(t testing.TB, dir string) Files {
	t.Helper()
	write := func(name, blockType string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	writePair := func(name string, c tls.Certificate) (certPath, keyPath string) {
		keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", c.Certificate[0]), write(name+"-key.pem", "PRIVATE KEY", keyDER)
	}
	f := Files{CA: write("ca.pem", "CERTIFICATE", p.caDER)}
	f.ServerCert, f.ServerKey = writePair("server", p.Server)
	f.ClientCert, f.ClientKey = writePair("client", p.Client)
	return f
}

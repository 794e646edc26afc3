// Tests of testpki: its configurations complete a mutual TLS handshake, and its files load back.

package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"
)

func TestMutualHandshake(t *testing.T) {
	pki := New(t, "127.0.0.1", "localhost")
	for _, name := range []string{"127.0.0.1", "localhost"} {
		a, b := net.Pipe()
		_ = a.SetDeadline(time.Now().Add(10 * time.Second))
		_ = b.SetDeadline(time.Now().Add(10 * time.Second))
		client := pki.ClientConfig()
		client.ServerName = name
		done := make(chan error, 1)
		go func() {
			defer b.Close()
			done <- tls.Client(b, client).Handshake()
		}()
		s := tls.Server(a, pki.ServerConfig())
		serverErr := s.Handshake()
		if serverErr == nil && len(s.ConnectionState().PeerCertificates) != 1 {
			t.Errorf("%s: the server saw %d client certificates", name, len(s.ConnectionState().PeerCertificates))
		}
		a.Close()
		if clientErr := <-done; serverErr != nil || clientErr != nil {
			t.Errorf("%s: handshake: server %v, client %v", name, serverErr, clientErr)
		}
	}
}

func TestWriteFiles(t *testing.T) {
	pki := New(t, "127.0.0.1")
	files := pki.WriteFiles(t, t.TempDir())
	for _, pair := range [][2]string{{files.ServerCert, files.ServerKey}, {files.ClientCert, files.ClientKey}} {
		if _, err := tls.LoadX509KeyPair(pair[0], pair[1]); err != nil {
			t.Errorf("%s, %s: %v", pair[0], pair[1], err)
		}
	}
	caPEM, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(caPEM) {
		t.Errorf("%s: no PEM certificate in it", files.CA)
	}
}

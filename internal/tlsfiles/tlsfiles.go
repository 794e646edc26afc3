// Package tlsfiles loads the PEM files that rkv's commands take TLS flags for, with errors naming the flag and the file.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Flag is a command-line flag that names a file: Name as the user writes
// it ("--tls-ca"), and Path its value.
type Flag struct {
	Name, Path string
}

// KeyPair loads a certificate chain and its private key from the PEM files
// named by cert and key.
func KeyPair(cert, key Flag) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(cert.Path)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", cert.Name, err)
	}
	keyPEM, err := os.ReadFile(key.Path)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s: %w", key.Name, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s %s, %s %s: %w", cert.Name, cert.Path, key.Name, key.Path, err)
	}
	return pair, nil
}

// CertPool loads the PEM certificates in the file named by ca into a pool
// of its own; a file without any is an error.
func CertPool(ca Flag) (*x509.CertPool, error) {
	caPEM, err := os.ReadFile(ca.Path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ca.Name, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", ca.Name, ca.Path)
	}
	return pool, nil
}

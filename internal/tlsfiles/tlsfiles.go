// Package tlsfiles loads the PEM files that rkv's commands take TLS flags for, with errors naming the flag and the file.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"
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
		return tls.Certificate{}, &InvalidError{fmt.Errorf("%s %s, %s %s: %w", cert.Name, cert.Path, key.Name, key.Path, err)}
	}
	return pair, nil
}

// InvalidError is a certificate or key that was read but cannot serve: not
// PEM of a certificate and its key, a key that does not match the
// certificate, a certificate outside its validity period. Unlike a flag
// mistake, it is what a command fails to start for.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// CheckValidity fails with an *InvalidError, naming the file and the
// dates, unless now lies in the validity period of pair's leaf
// certificate (the one KeyPair loaded from cert): a server that starts
// with an expired or not yet valid certificate would have every TLS client
// refuse it, each with an error the server never sees; a client, every
// server, with a handshake error that names neither the file nor the dates.
func CheckValidity(cert Flag, pair tls.Certificate, now time.Time) error {
	leaf := pair.Leaf
	if leaf == nil {
		if len(pair.Certificate) == 0 {
			return &InvalidError{fmt.Errorf("%s %s: no certificate", cert.Name, cert.Path)}
		}
		var err error
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return &InvalidError{fmt.Errorf("%s %s: %w", cert.Name, cert.Path, err)}
		}
	}
	const day = time.RFC3339
	period := fmt.Sprintf("valid from %s to %s, now is %s", leaf.NotBefore.UTC().Format(day), leaf.NotAfter.UTC().Format(day), now.UTC().Format(day))
	switch {
	case now.Before(leaf.NotBefore):
		return &InvalidError{fmt.Errorf("%s %s: the certificate (subject %q) is not valid yet: %s (check this machine's clock, or use a certificate valid now)", cert.Name, cert.Path, leaf.Subject.String(), period)}
	case now.After(leaf.NotAfter):
		return &InvalidError{fmt.Errorf("%s %s: the certificate (subject %q) has expired: %s (issue a new one)", cert.Name, cert.Path, leaf.Subject.String(), period)}
	}
	return nil
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

// Tests of tlsfiles: what loads, and errors that name the flag and the file.

package tlsfiles

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testpki"
)

func TestKeyPairAndCertPool(t *testing.T) {
	dir := t.TempDir()
	files := testpki.New(t, "127.0.0.1").WriteFiles(t, dir)
	missing := filepath.Join(dir, "missing.pem")
	flag := func(name, path string) Flag { return Flag{Name: name, Path: path} }

	if _, err := KeyPair(flag("--cert", files.ServerCert), flag("--key", files.ServerKey)); err != nil {
		t.Errorf("a matching pair: %v", err)
	}
	if _, err := CertPool(flag("--ca", files.CA)); err != nil {
		t.Errorf("a CA certificate: %v", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a missing certificate", second(KeyPair(flag("--cert", missing), flag("--key", files.ServerKey))), "--cert: open " + missing},
		{"a missing key", second(KeyPair(flag("--cert", files.ServerCert), flag("--key", missing))), "--key: open " + missing},
		{"a key of another certificate", second(KeyPair(flag("--cert", files.ServerCert), flag("--key", files.ClientKey))),
			"--cert " + files.ServerCert + ", --key " + files.ClientKey + ": tls: private key does not match public key"},
		{"a missing CA file", second(CertPool(flag("--ca", missing))), "--ca: open " + missing},
		{"a CA file without a certificate", second(CertPool(flag("--ca", files.ServerKey))), "--ca " + files.ServerKey + ": no PEM certificate in it"},
	} {
		if tc.err == nil || !strings.HasPrefix(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error starting %q", tc.name, tc.err, tc.want)
		}
	}
}

// second is the error of a call that returns a value and an error.
func second[T any](_ T, err error) error { return err }

// CheckValidity refuses a certificate before or after its period, naming
// the file and the dates, and takes one within it.
func TestCheckValidity(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	files := testpki.NewValid(t, now.Add(-24*time.Hour), now.Add(24*time.Hour), "127.0.0.1").WriteFiles(t, dir)
	cert := Flag{Name: "--tls-cert", Path: files.ServerCert}
	pair, err := KeyPair(cert, Flag{Name: "--tls-key", Path: files.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckValidity(cert, pair, now); err != nil {
		t.Fatalf("within the period: %v", err)
	}
	period := "valid from 2030-05-31T12:00:00Z to 2030-06-02T12:00:00Z"
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now.Add(-48 * time.Hour), "--tls-cert " + files.ServerCert + `: the certificate (subject "CN=server") is not valid yet: ` + period + ", now is 2030-05-30T12:00:00Z (check this machine's clock, or use a certificate valid now)"},
		{now.Add(48 * time.Hour), "--tls-cert " + files.ServerCert + `: the certificate (subject "CN=server") has expired: ` + period + ", now is 2030-06-03T12:00:00Z (issue a new one)"},
	} {
		err := CheckValidity(cert, pair, tc.at)
		if _, ok := errors.AsType[*InvalidError](err); !ok || err.Error() != tc.want {
			t.Errorf("at %v: %v, want an InvalidError %q", tc.at, err, tc.want)
		}
	}
}

// Dialing a server's control address: plaintext TCP, or TLS when Config.TLS is set.

package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
)

// dialControl connects to a server's control address. With Config.TLS the
// TLS handshake is done before it returns, so a server that fails
// verification is never sent the Hello and its token.
func (c *Client) dialControl(ctx context.Context, addr string) (net.Conn, error) {
	if c.cfg.TLS == nil {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	d := tls.Dialer{Config: c.cfg.TLS}
	return d.DialContext(ctx, "tcp", addr)
}

// tlsRefusal turns a TLS failure that no retry can fix (a certificate
// one side refused) into ErrUnauthenticated; any other error is returned
// as it is. The result is not retryable even when err was. With TLS 1.3 a server refusing the client's certificate is
// only seen at the first read after the handshake, so the Hello's error
// goes through here too.
func tlsRefusal(server string, err error) error {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		op      *net.OpError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid):
		return fmt.Errorf("%w: the certificate of %s: %v", ErrUnauthenticated, server, err)
	case errors.As(err, &op) && op.Op == "remote error": // a TLS alert from the server
		return fmt.Errorf("%w: %s refused the TLS session: %v", ErrUnauthenticated, server, err)
	}
	return err
}

// Dialing a server's control address: plaintext TCP, or TLS when Config.TLS is set.

package client

import (
	"context"
	"crypto/tls"
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

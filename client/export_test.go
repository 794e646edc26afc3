package client

// DisableWriteSessions makes c's writes opt out of idempotency (Session 0),
// so that a benchmark can tell the sessions' cost from the rest of a PUT's.
// Call it before c's first write.
func DisableWriteSessions(c *Client) { c.ids.off = true }

package client

// DisableWriteSessions makes c's writes opt out of idempotency (Session 0),
// so that a benchmark can tell the sessions' cost from the rest of a PUT's.
// Call it before c's first write.
func DisableWriteSessions(c *Client) { c.ids.off = true }

// CollideInCache gives key to's location-cache entry the location of key
// from's, as when the two keys' hashes collide, and reports whether from
// had one.
func CollideInCache(c *Client, from, to []byte) bool {
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	l, ok := c.cache[c.cacheKey(from)]
	if ok {
		c.cache[c.cacheKey(to)] = l
	}
	return ok
}

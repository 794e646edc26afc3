// Parsing gossip encryption keys as operators write them.

package membership

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ParseKey decodes a gossip key given in hex or base64 (standard or URL,
// padded or not) and checks its length: 16, 24 or 32 bytes (AES-128, -192
// or -256), as Config.SecretKey needs.
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	var key []byte
	if b, err := hex.DecodeString(s); err == nil && (len(b) == 16 || len(b) == 24 || len(b) == 32) {
		key = b
	} else {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err := enc.DecodeString(s); err == nil {
				key = b
				break
			}
		}
	}
	if key == nil {
		return nil, errors.New("membership: gossip key is neither hex nor base64")
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("membership: gossip key of %d bytes: want 16, 24 or 32 (AES-128/192/256)", len(key))
}

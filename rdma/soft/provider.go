// Registration of the "soft" provider with package rdma.

package soft

import (
	"github.com/rkv-io/rkv/rdma"
)

// ProviderName is the name the soft provider registers under, for
// rdma.Open.
const ProviderName = "soft"

// DefaultDevice is the name of the device opened for "" and "auto", and
// the one name Devices lists. Any other name opens a device of that name:
// every Open creates a new, independent device.
const DefaultDevice = "soft0"

func init() { rdma.RegisterProvider(provider{}) }

type provider struct{}

func (provider) Name() string { return ProviderName }

func (provider) Devices() ([]string, error) { return []string{DefaultDevice}, nil }

func (provider) Open(name string, opts rdma.Options) (rdma.Device, error) {
	if name == "" || name == "auto" {
		name = DefaultDevice
	}
	return openDevice(name, opts)
}

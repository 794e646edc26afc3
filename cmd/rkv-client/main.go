// Command rkv-client is rkv's command-line client. Today it has one command,
// devices, which shows the RDMA providers compiled in and the devices each
// can open; get/put/del/scan/members arrive with the cluster (issue 5).
package main

import (
	"fmt"
	"os"

	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] != "devices" {
		fmt.Fprintln(os.Stderr, "usage: rkv-client devices")
		os.Exit(2)
	}
	if err := devices(); err != nil {
		fmt.Fprintln(os.Stderr, "rkv-client:", err)
		os.Exit(1)
	}
}

func devices() error {
	for _, name := range rdma.Providers() {
		devs, err := rdma.ProviderDevices(name)
		if err != nil {
			fmt.Printf("%-6s error: %v\n", name, err)
			continue
		}
		if len(devs) == 0 {
			fmt.Printf("%-6s no devices\n", name)
		}
		for _, d := range devs {
			fmt.Printf("%-6s %s\n", name, d)
		}
	}
	return nil
}

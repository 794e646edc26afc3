module github.com/rkv-io/rkv

go 1.26.8

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

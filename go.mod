module github.com/rkv-io/rkv

go 1.26.8

require (
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

//go:build verbs && !cgo

package verbs

// The verbs provider is cgo over libibverbs: building it with the verbs tag
// but without cgo would leave a package that registers nothing. Fail the
// build instead, naming the fix.
var _ = rdma_verbs_needs_cgo__set_CGO_ENABLED_1_and_install_a_C_compiler

package rdma

// SetOnMainThread makes the Registrar's check for the main thread f, for
// a test, and returns what puts the real one back.
func SetOnMainThread(f func() bool) (restore func()) {
	old := onMainThread
	onMainThread = f
	return func() { onMainThread = old }
}

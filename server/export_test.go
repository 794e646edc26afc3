package server

// Isolate cuts s off from the other servers, as a partition would, while
// its clients' sessions and their one-sided reads go on: its gossip and
// its Raft replica stop, so it learns no map again, it asks for no read
// lease again, and the view it gives clients has every other server dead.
func Isolate(s *Server) {
	s.isolated.Store(true)
	s.lease.noRenew.Store(true)
	_ = s.ml.Shutdown()
	_ = s.node.Close()
}

package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rkv-io/rkv/internal/buildinfo"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/server"
)

// collector reads a server's counters at each scrape: nothing on the
// server's paths updates a Prometheus metric.
type collector struct {
	srv *server.Server

	regDone, regFailed, regCanceled, regBytes, regQueued, regInFlight *prometheus.Desc
	regLatency                                                        *prometheus.Desc
	arenas, arenaBytes, segments                                      *prometheus.Desc
	arenaReg, arenaRegBytes, storeOpen                                *prometheus.Desc
	segmentsFreed, segmentsCleaned, cleanerMoved, committedBytes      *prometheus.Desc
	leasesActive, leasesGranted, leasesExpired, leasesRefused         *prometheus.Desc
	commits, commitsRejected, deletes, batches, syncSeconds           *prometheus.Desc
	keys, indexLoad, indexMoves, indexSlots, indexGrowths             *prometheus.Desc
	sessions, sessionsEvictedEarly                                    *prometheus.Desc
	indexFlushes, indexFlushed, indexFlushSeconds, indexLogFull       *prometheus.Desc
	handled, refused, connections, generation                         *prometheus.Desc
	commitsOnQP, forwardsOnQP, qpCommitBatches, readLeasesRefused     *prometheus.Desc
	catchUpShards, catchUpKeys, catchUpBytes, catchUpSeconds          *prometheus.Desc
	movedIn, pulledKeys, pulledBytes                                  *prometheus.Desc
}

func newCollector(srv *server.Server) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("rkv_"+name, help, labels, nil)
	}
	return &collector{
		srv:                  srv,
		regDone:              d("registrar_registrations_total", "Memory registrations completed successfully."),
		regFailed:            d("registrar_failures_total", "Memory registrations the provider failed."),
		regCanceled:          d("registrar_canceled_total", "Memory registrations cancelled by their context or by Close."),
		regBytes:             d("registrar_registered_bytes_total", "Bytes registered successfully."),
		regQueued:            d("registrar_queued", "Registrations waiting for a worker."),
		regInFlight:          d("registrar_in_flight", "Registrations being pinned now."),
		regLatency:           d("registrar_latency_seconds", "Time from submission to completion of successful registrations."),
		arenas:               d("arenas_registered", "Arenas registered and advertised, every unit of them."),
		arenaRegBytes:        d("arenas_registered_bytes", "Arena bytes registered and advertised so far (arenas register in units): rkv_arenas_bytes{state=\"size\"} once all are."),
		arenaBytes:           d("arenas_bytes", "Arena bytes by state: size, live (current records), dead (for the cleaner), free.", "state"),
		arenaReg:             d("arena_registration_seconds", "Time from the store's open to the registration of each registered arena's last unit.", "arena"),
		storeOpen:            d("store_open_time_seconds", "Unix time the store began opening at this start: the zero of rkv_arena_registration_seconds."),
		segments:             d("segments", "Arena segments: all of them (total) and those free.", "state"),
		segmentsFreed:        d("segments_freed_total", "Segments that came free: emptied by overwrites, deletes, drops or the cleaner."),
		segmentsCleaned:      d("cleaner_segments_cleaned_total", "Segments the cleaner emptied."),
		cleanerMoved:         d("cleaner_moved_bytes_total", "Record bytes the cleaner copied out of segments."),
		committedBytes:       d("committed_bytes_total", "Record bytes of acknowledged puts (cleaner_moved_bytes_total over this is its write amplification)."),
		leasesRefused:        d("leases_refused_total", "Write leases refused for want of space."),
		leasesActive:         d("leases_active", "Write leases active now."),
		leasesGranted:        d("leases_granted_total", "Write leases granted."),
		leasesExpired:        d("leases_expired_total", "Write leases that expired unrenewed."),
		commits:              d("commits_total", "Puts acknowledged."),
		commitsRejected:      d("commits_rejected_total", "Commits refused at validation (bad lease or record)."),
		deletes:              d("deletes_total", "Deletes acknowledged."),
		batches:              d("commit_batches_total", "Group commits."),
		syncSeconds:          d("sync_seconds_total", "Time spent making commits durable (msync, fsync)."),
		keys:                 d("keys", "Keys stored."),
		indexLoad:            d("index_load_ratio", "Hash index load factor."),
		indexMoves:           d("index_moves_total", "Hopscotch displacements."),
		indexSlots:           d("index_slots", "Home slots of the hash index (it doubles while serving)."),
		indexGrowths:         d("index_growths_total", "Times the hash index grew while serving."),
		indexFlushes:         d("index_log_flushes_total", "The index log's flushes into the index's Pebble (under --sync always or batch, each a checkpoint of the arenas)."),
		indexFlushed:         d("index_log_flushed_entries_total", "Entries the index log's flushes wrote: fewer than the commits logged when keys are written again between flushes."),
		indexFlushSeconds:    d("index_log_flush_seconds_total", "Time the index log's flushes took."),
		indexLogFull:         d("index_log_full_total", "Commits that waited for a flush because the index log was full. If it grows, raise --index-log-size."),
		sessions:             d("idempotency_sessions", "Idempotency entries held: the last write of each (shard, writer session), for answering retries."),
		sessionsEvictedEarly: d("idempotency_sessions_evicted_early_total", "Idempotency entries dropped before their TTL because the table was full: a retry of their write would apply twice. If it grows, raise --max-sessions."),
		handled:              d("control_requests_total", "Control RPC requests handled, by type (a backup's forwarded commits and deletes among them).", "type"),
		commitsOnQP:          d("qp_commits_total", "Commits and commit batches that came on a session's write QP after their records' WRITE (a PUT in one round trip), not as control RPCs; control_requests_total counts them too."),
		qpCommitBatches:      d("qp_commit_batches_total", "Batches the commits that came together on write QPs were committed in, one group commit each (soft); qp_commits_total over it is the commits per batch."),
		readLeasesRefused:    d("read_leases_refused_total", "GetReadLease requests answered with no lease: the map's leader had not renewed this server's read lease (it may be cut off, its shards about to fail over), so clients read nothing here."),
		forwardsOnQP:         d("qp_forwards_total", "Replica commits and deletes a primary forwarded on this server's write QP (a SEND each way), not as control RPCs; control_requests_total counts them too."),
		refused:              d("control_errors_total", "Control RPC requests answered with an error, by its code (Hellos refused included).", "code"),
		connections:          d("control_connections", "Open control connections."),
		generation:           d("generation", "The store's generation of this start."),
		catchUpShards:        d("catchup_shards", "Shards the moves into this server are copying now (catching up), by state: copying (all of them) and copied (a pass copied them completely; later passes take what changed).", "state"),
		catchUpKeys:          d("catchup_copied_keys", "Records and deletes the moves copying now have copied so far."),
		catchUpBytes:         d("catchup_copied_bytes", "Record bytes the moves copying now have copied so far."),
		catchUpSeconds:       d("catchup_seconds", "Time since the earliest move copying now began; 0 when none runs."),
		movedIn:              d("moved_in_shards_total", "Shards the moves into this server finished (promotions included)."),
		pulledKeys:           d("copy_pulled_keys_total", "Records and deletes every copy pass into this server brought, of moves finished, running or aborted."),
		pulledBytes:          d("copy_pulled_bytes_total", "Record bytes every copy pass into this server brought (its rate is the copy's MiB/s)."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	rs := c.srv.RegistrarStats()
	counter(c.regDone, float64(rs.Done))
	counter(c.regFailed, float64(rs.Failed))
	counter(c.regCanceled, float64(rs.Canceled))
	counter(c.regBytes, float64(rs.Bytes))
	gauge(c.regQueued, float64(rs.Queued))
	gauge(c.regInFlight, float64(rs.InFlight))
	buckets := map[float64]uint64{}
	var cum uint64
	for i := range rdma.LatencyBuckets {
		cum += rs.Latency[i]
		buckets[rdma.LatencyBucketBound(i).Seconds()] = cum
	}
	ch <- prometheus.MustNewConstHistogram(c.regLatency, cum, rs.LatencySum.Seconds(), buckets)

	st := c.srv.Store().Stats()
	var registered int
	var registeredBytes int64
	for _, a := range st.Arenas {
		if a.Registered {
			registered++
		}
		registeredBytes += a.RegisteredBytes
	}
	gauge(c.arenas, float64(registered))
	gauge(c.arenaRegBytes, float64(registeredBytes))
	for _, a := range st.Arenas {
		if a.Registration > 0 { // an arena not registered yet has no series
			gauge(c.arenaReg, a.Registration.Seconds(), strconv.Itoa(int(a.ID)))
		}
	}
	gauge(c.storeOpen, float64(st.Opened.UnixNano())/1e9)
	gauge(c.arenaBytes, float64(st.Capacity), "size")
	gauge(c.arenaBytes, float64(st.Live), "live")
	gauge(c.arenaBytes, float64(st.Dead), "dead")
	gauge(c.arenaBytes, float64(st.Free), "free")
	gauge(c.segments, float64(st.Segments), "total")
	gauge(c.segments, float64(st.FreeSegments), "free")
	counter(c.segmentsFreed, float64(st.SegmentsFreed))
	counter(c.segmentsCleaned, float64(st.SegmentsCleaned))
	counter(c.cleanerMoved, float64(st.CleanerMovedBytes))
	counter(c.committedBytes, float64(st.CommittedBytes))
	counter(c.leasesRefused, float64(st.LeasesRefused))
	gauge(c.leasesActive, float64(st.LeasesActive))
	counter(c.leasesGranted, float64(st.LeasesGranted))
	counter(c.leasesExpired, float64(st.LeasesExpired))
	counter(c.commits, float64(st.Commits))
	counter(c.commitsRejected, float64(st.CommitsRejected))
	counter(c.deletes, float64(st.Deletes))
	counter(c.batches, float64(st.Batches))
	counter(c.syncSeconds, st.SyncTime.Seconds())
	gauge(c.keys, float64(st.Keys))
	gauge(c.indexLoad, st.IndexLoad)
	counter(c.indexMoves, float64(st.IndexMoves))
	gauge(c.indexSlots, float64(st.IndexSlots))
	counter(c.indexGrowths, float64(st.IndexGrowths))
	counter(c.indexFlushes, float64(st.IndexFlushes))
	counter(c.indexFlushed, float64(st.IndexFlushedEntries))
	counter(c.indexFlushSeconds, st.IndexFlushTime.Seconds())
	counter(c.indexLogFull, float64(st.IndexLogFull))
	gauge(c.sessions, float64(st.Sessions))
	counter(c.sessionsEvictedEarly, float64(st.SessionsEvictedEarly))

	ss := c.srv.Stats()
	for _, t := range []proto.MsgType{proto.MsgHello, proto.MsgGrantLease, proto.MsgCommit, proto.MsgCommitBatch, proto.MsgDelete, proto.MsgScan, proto.MsgEndLease, proto.MsgStats,
		proto.MsgReplicaCommit, proto.MsgReplicaDelete} {
		counter(c.handled, float64(ss.Handled[t]), t.String())
	}
	for code := proto.ErrorCode(1); int(code) < proto.NumErrorCodes; code++ {
		counter(c.refused, float64(ss.Refused[code]), code.String())
	}
	counter(c.commitsOnQP, float64(ss.CommitsOnQP))
	counter(c.forwardsOnQP, float64(ss.ForwardsOnQP))
	counter(c.qpCommitBatches, float64(ss.QPCommitBatches))
	counter(c.readLeasesRefused, float64(ss.ReadLeasesRefused))
	gauge(c.connections, float64(ss.Connections))
	gauge(c.generation, float64(c.srv.Generation()))

	ms := c.srv.MoveStats()
	gauge(c.catchUpShards, float64(ms.Copying.Shards), "copying")
	gauge(c.catchUpShards, float64(ms.Copying.Copied), "copied")
	gauge(c.catchUpKeys, float64(ms.Copying.Keys))
	gauge(c.catchUpBytes, float64(ms.Copying.Bytes))
	gauge(c.catchUpSeconds, ms.Copying.Elapsed.Seconds())
	counter(c.movedIn, float64(ms.ShardsMovedIn))
	counter(c.pulledKeys, float64(ms.PulledKeys))
	counter(c.pulledBytes, float64(ms.PulledBytes))
}

// metricsHandler serves the server's registry; its errors go to h.
func metricsHandler(srv *server.Server, h slog.Handler) http.Handler {
	return promhttp.HandlerFor(newRegistry(srv), promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(h, slog.LevelError)})
}

// newRegistry is the server's own registry: its collector, the build's
// rkv_build_info, and the Go runtime's and process's.
func newRegistry(srv *server.Server) *prometheus.Registry {
	bi := buildinfo.Read()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "rkv_build_info",
		Help:        "Always 1; its labels say what the server was built from.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.Commit, "go": bi.Go},
	})
	build.Set(1)
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(srv), build,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// newMetricsMux serves --metrics-addr: metrics on /metrics; /healthz,
// 200 while the process serves HTTP at all (a liveness probe); /readyz,
// 200 while ready returns nil (the server serves: an arena registered, in
// a bootstrapped map), else 503 with its error (a readiness probe); and
// with --pprof, Go's profiles.
func newMetricsMux(metrics http.Handler, ready func() error, withPprof bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if withPprof {
		// Profiles, for finding where a benchmark's time goes. They show
		// the process's internals, so only when asked for; never
		// /debug/pprof/cmdline, which would show an --auth-token given on
		// the command line.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

package worker

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the worker's Prometheus series.
type Metrics struct {
	instances      *prometheus.GaugeVec
	starts         *prometheus.HistogramVec
	droppedRecords prometheus.Counter
	// restoreFailures counts start snapshots that could not be restored
	// (the call then started cold).
	restoreFailures prometheus.Counter
	// forkFallbacks counts instances started on their own because the
	// fork path could not serve them; reclaimed counts what the memory
	// reclaimer stopped, by kind.
	forkFallbacks prometheus.Counter
	reclaimed     *prometheus.CounterVec
	// moves counts calls that left this worker as checkpoints, by reason.
	moves *prometheus.CounterVec
}

// NewMetrics registers the worker's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "torpor_instances",
			Help: "Function instances on this worker: live (all) and idle (parked for reuse)."}, []string{"state"}),
		starts: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "torpor_instance_start_seconds",
			Help:    "Time to obtain an instance for a call, by start path.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"path"}),
		droppedRecords: prometheus.NewCounter(prometheus.CounterOpts{Name: "torpor_call_records_dropped_total",
			Help: "Records of synchronous calls not stored because the writer was overloaded."}),
	}
	m.restoreFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "torpor_snapshot_restore_failures_total",
		Help: "Start snapshots that could not be restored; each such call started cold instead."})
	m.forkFallbacks = prometheus.NewCounter(prometheus.CounterOpts{Name: "torpor_fork_fallbacks_total",
		Help: "Instances started on their own (cold) because no template could fork them."})
	m.reclaimed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "torpor_reclaimed_total",
		Help: "Processes the memory reclaimer stopped, by kind (instance, function-template)."}, []string{"kind"})
	m.moves = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "torpor_call_moves_total",
		Help: "Running calls that left this worker as checkpoints to finish elsewhere, by reason (eviction, slice)."}, []string{"reason"})
	reg.MustRegister(m.instances, m.starts, m.droppedRecords, m.restoreFailures, m.forkFallbacks, m.reclaimed, m.moves)
	return m
}

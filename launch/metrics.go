package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// The metrics a MetricsExporter serves, named as Prometheus's conventions
// ask: the gtrain_ prefix, base units (_bytes, _seconds), _total on
// counters, one label per dimension.
var (
	descJobInfo = prometheus.NewDesc("gtrain_job_info",
		"The job: its run id and layout (always 1).", []string{"run_id", "layout"}, nil)
	descState = prometheus.NewDesc("gtrain_rank_state",
		"1 for the rank's state (pending, running, exited, failed, stopped), 0 for the others.", []string{"rank", "host", "state"}, nil)
	descStep = prometheus.NewDesc("gtrain_rank_step",
		"The last step the rank reported.", []string{"rank", "host"}, nil)
	descLoss = prometheus.NewDesc("gtrain_rank_loss",
		"The training loss of the rank's last step.", []string{"rank", "host"}, nil)
	descValLoss = prometheus.NewDesc("gtrain_rank_val_loss",
		"The rank's last validation loss.", []string{"rank", "host"}, nil)
	descLR = prometheus.NewDesc("gtrain_rank_learning_rate",
		"The learning rate of the rank's last step.", []string{"rank", "host"}, nil)
	descTokens = prometheus.NewDesc("gtrain_rank_tokens_per_second",
		"Tokens per second over the rank's last step.", []string{"rank", "host"}, nil)
	descStepTime = prometheus.NewDesc("gtrain_rank_step_seconds",
		"Wall time of the rank's last step.", []string{"rank", "host"}, nil)
	descWait = prometheus.NewDesc("gtrain_rank_comm_wait_seconds",
		"Of the last step, the time the rank waited in collectives.", []string{"rank", "host"}, nil)
	descMemory = prometheus.NewDesc("gtrain_rank_memory_bytes",
		"Bytes the rank holds, by category (params, grads, optimizer, activations, buffers, snapshot, total).", []string{"rank", "host", "category"}, nil)
	descRestarts = prometheus.NewDesc("gtrain_host_restarts_total",
		"Times the host's ranks were started again after the job's first attempt.", []string{"host"}, nil)
	descLost = prometheus.NewDesc("gtrain_host_lost_total",
		"Times the host was lost (its agent ended, fell silent or never joined) or dropped from an elastic job, once per loss.", []string{"host"}, nil)
)

// MetricsExporter is a status.View that serves the job's state to
// Prometheus on /metrics: per-rank gauges from the ranks' status records,
// per-host counters of restarts and losses, and the job's info. It reads
// the state when scraped, so a scrape sees the last record of each rank.
type MetricsExporter struct {
	model *status.Model
	runID string

	mu sync.Mutex
	// layout names the layout the ranks run in gtrain_job_info; "" until
	// it is known (SetLayout), and no job info is served until then.
	layout   string
	started  map[string]bool // hosts whose ranks have started in some attempt
	restarts map[string]int
	lost     map[string]int
	// lostNow are the hosts lost in the attempt that ran last: an elastic
	// job then drops them too (host_dropped), the same loss.
	lostNow map[string]bool

	ln   net.Listener
	srv  *http.Server
	done chan error
}

// ParseMetricsAddr checks addr, a listen address as Prometheus exporters
// take it (":9400" is every interface, "127.0.0.1:9400" loopback only);
// a bad one is a usage error naming it.
func ParseMetricsAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 0 || n > 65535 {
			err = fmt.Errorf("port %q is not a number from 0 to 65535", port)
		}
	}
	if err != nil {
		return usage.Errorf("--metrics-addr %q: %v; want HOST:PORT, e.g. :9400 (every interface) or 127.0.0.1:9400", addr, err)
	}
	return nil
}

// ServeMetrics listens on addr and serves the metrics of the job whose
// ranks are ranks, run runID with the given layout, until Close. A job
// whose layout is known only once its attempt is planned (per-node mode,
// --auto on several hosts, an elastic job) passes "" and calls SetLayout.
func ServeMetrics(addr, runID, layout string, ranks []status.RankInfo) (*MetricsExporter, error) {
	if err := ParseMetricsAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("launch: metrics: listen on %s: %w; pick another --metrics-addr", addr, err)
	}
	e := &MetricsExporter{
		model: status.NewModel(ranks), runID: runID, layout: layout,
		started: map[string]bool{}, restarts: map[string]int{}, lost: map[string]int{}, lostNow: map[string]bool{},
		ln: ln, done: make(chan error, 1),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(e, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { e.done <- e.srv.Serve(ln) }()
	return e, nil
}

// Addr is the address the exporter listens on.
func (e *MetricsExporter) Addr() net.Addr { return e.ln.Addr() }

// SetLayout names the layout the job's ranks run from now on in
// gtrain_job_info: the one series of the job's info changes its label,
// so an attempt planned anew replaces the series rather than add one.
func (e *MetricsExporter) SetLayout(layout string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.layout = layout
}

// Event updates the state with one event of the job.
func (e *MetricsExporter) Event(ev proto.Event) {
	e.model.Apply(ev)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case ev.Type == proto.EventRankStarted && ev.Local == 0:
		// One rank_started with local rank 0 per host and attempt.
		if e.started[ev.Host] {
			e.restarts[ev.Host]++
		}
		e.started[ev.Host] = true
	case ev.Type == proto.EventAttempt:
		clear(e.lostNow)
	case ev.Type == proto.EventHostLost:
		e.lost[ev.Host]++
		e.lostNow[ev.Host] = true
	case ev.Type == proto.EventHostDropped && !e.lostNow[ev.Host]:
		// Dropped for another reason: it hung the job, or failed too often.
		e.lost[ev.Host]++
	}
}

// Close stops serving, letting a scrape in progress finish (for at most 5 s).
func (e *MetricsExporter) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.srv.Shutdown(ctx)
	if serr := <-e.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("launch: metrics on %s: %w", e.ln.Addr(), err)
	}
	return nil
}

// Describe sends nothing: the exporter is an unchecked collector, its
// series (ranks, hosts, categories) known only as the job reports them.
func (e *MetricsExporter) Describe(chan<- *prometheus.Desc) {}

// Collect sends the job's metrics as they are now.
func (e *MetricsExporter) Collect(ch chan<- prometheus.Metric) {
	for _, r := range e.model.Ranks() {
		collectRank(ch, r)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.layout != "" {
		ch <- prometheus.MustNewConstMetric(descJobInfo, prometheus.GaugeValue, 1, e.runID, e.layout)
	}
	for host := range e.started {
		ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(e.restarts[host]), host)
	}
	for host, n := range e.lost {
		ch <- prometheus.MustNewConstMetric(descLost, prometheus.CounterValue, float64(n), host)
	}
}

// rankStates are the states gtrain_rank_state enumerates.
var rankStates = []status.State{status.Pending, status.Running, status.Exited, status.Failed, status.Stopped}

// collectRank sends r's gauges: the state always, the rest once reported.
func collectRank(ch chan<- prometheus.Metric, r status.RankState) {
	rank := strconv.Itoa(r.Rank)
	for _, s := range rankStates {
		v := 0.0
		if r.State == s {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, rank, r.Host, s.String())
	}
	gauge := func(d *prometheus.Desc, v *float64, scale float64) {
		if v != nil {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, *v*scale, rank, r.Host)
		}
	}
	if r.Step != nil {
		step := float64(*r.Step)
		gauge(descStep, &step, 1)
	}
	gauge(descLoss, r.Loss, 1)
	gauge(descValLoss, r.ValLoss, 1)
	gauge(descLR, r.LR, 1)
	gauge(descTokens, r.TokensPerS, 1)
	gauge(descStepTime, r.StepMillis, 1e-3)
	gauge(descWait, r.WaitMillis, 1e-3)
	if r.Memory != nil {
		for _, c := range r.Memory.Categories() {
			ch <- prometheus.MustNewConstMetric(descMemory, prometheus.GaugeValue, float64(c.Bytes), rank, r.Host, c.Name)
		}
	}
}

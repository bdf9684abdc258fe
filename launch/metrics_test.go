package launch

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch/proto"
	"github.com/gtrain/gtrain/launch/status"
)

// scrape reads the exporter's /metrics as Prometheus parses it.
func scrape(t *testing.T, e *MetricsExporter) map[string][]*model.Sample {
	t.Helper()
	resp, err := http.Get("http://" + e.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	dec := expfmt.SampleDecoder{Dec: expfmt.NewDecoder(strings.NewReader(string(body)), expfmt.NewFormat(expfmt.TypeTextPlain)),
		Opts: &expfmt.DecodeOptions{}}
	var all model.Vector
	for {
		var v model.Vector
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("parse /metrics: %v\n%s", err, body)
		}
		all = append(all, v...)
	}
	out := map[string][]*model.Sample{}
	for _, s := range all {
		name := string(s.Metric[model.MetricNameLabel])
		out[name] = append(out[name], s)
	}
	return out
}

// value is the sample of name whose labels include labels.
func value(t *testing.T, m map[string][]*model.Sample, name string, labels map[string]string) float64 {
	t.Helper()
next:
	for _, s := range m[name] {
		for k, v := range labels {
			if string(s.Metric[model.LabelName(k)]) != v {
				continue next
			}
		}
		return float64(s.Value)
	}
	t.Fatalf("no %s%v among %v", name, labels, m[name])
	return 0
}

// TestMetricsExporter: the exporter serves each rank's state and the
// engine's figures in base units, counts a host's restarts (its ranks
// started again) and losses (an elastic drop), and names the job.
func TestMetricsExporter(t *testing.T) {
	ranks := []status.RankInfo{{Rank: 0, Host: "w0"}, {Rank: 1, Host: "w1", Node: 1}}
	e, err := ServeMetrics("127.0.0.1:0", "run-1", "dp 2", ranks)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rec := `{"step":7,"loss":2.5,"val_loss":2.75,"lr":0.001,"tokens_per_s":5000,"step_ms":120,"comm_wait_ms":20,` +
		`"memory":{"params":100,"grads":100,"optimizer":200,"activations":50,"buffers":10,"total":460}}`
	for _, ev := range []proto.Event{
		{Type: proto.EventRankStarted, Rank: 0, Host: "w0", PID: 1},
		{Type: proto.EventRankStarted, Rank: 1, Host: "w1", Node: 1, PID: 2},
		{Type: proto.EventRankExited, Rank: 1, Host: "w1", Node: 1, Code: 1},
		{Type: proto.EventHostDropped, Rank: -1, Host: "w1", Node: -1},
		{Type: proto.EventRankStarted, Rank: 0, Host: "w0", PID: 3},
		{Type: proto.EventStatus, Rank: 0, Host: "w0", Status: json.RawMessage(rec)},
	} {
		e.Event(ev)
	}
	m := scrape(t, e)
	r0 := map[string]string{"rank": "0", "host": "w0"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gtrain_job_info", map[string]string{"run_id": "run-1", "layout": "dp 2"}, 1},
		{"gtrain_rank_state", map[string]string{"rank": "0", "state": "running"}, 1},
		{"gtrain_rank_state", map[string]string{"rank": "0", "state": "pending"}, 0},
		{"gtrain_rank_state", map[string]string{"rank": "1", "state": "failed"}, 1},
		{"gtrain_rank_step", r0, 7},
		{"gtrain_rank_loss", r0, 2.5},
		{"gtrain_rank_val_loss", r0, 2.75},
		{"gtrain_rank_learning_rate", r0, 0.001},
		{"gtrain_rank_tokens_per_second", r0, 5000},
		{"gtrain_rank_step_seconds", r0, 0.12},
		{"gtrain_rank_comm_wait_seconds", r0, 0.02},
		{"gtrain_rank_memory_bytes", map[string]string{"rank": "0", "category": "optimizer"}, 200},
		{"gtrain_rank_memory_bytes", map[string]string{"rank": "0", "category": "total"}, 460},
		{"gtrain_host_restarts_total", map[string]string{"host": "w0"}, 1},
		{"gtrain_host_restarts_total", map[string]string{"host": "w1"}, 0},
		{"gtrain_host_lost_total", map[string]string{"host": "w1"}, 1},
	} {
		if got := value(t, m, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := m["gtrain_rank_loss"]; !ok || len(m["gtrain_rank_loss"]) != 1 {
		t.Errorf("gtrain_rank_loss for %d ranks, want only rank 0 (rank 1 reported none)", len(m["gtrain_rank_loss"]))
	}
}

// TestMetricsAddrRefused: a bad address is a usage error naming it; one
// in use is an error naming it.
func TestMetricsAddrRefused(t *testing.T) {
	for _, addr := range []string{"9400", "localhost:http2", "127.0.0.1:70000", "[::1"} {
		_, err := ServeMetrics(addr, "r", "l", nil)
		if !errors.As(err, new(*usage.Error)) || !strings.Contains(err.Error(), addr) {
			t.Errorf("ServeMetrics(%q) = %v, want a usage error naming it", addr, err)
		}
	}
	e, err := ServeMetrics("127.0.0.1:0", "r", "l", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	busy := e.Addr().String()
	if _, err := ServeMetrics(busy, "r", "l", nil); err == nil || !strings.Contains(err.Error(), busy) {
		t.Errorf("ServeMetrics(%s) in use = %v, want an error naming it", busy, err)
	}
}

// TestGrafanaDashboardNames: every gtrain metric the example dashboard
// queries is one the exporter serves.
func TestGrafanaDashboardNames(t *testing.T) {
	b, err := os.ReadFile("../examples/grafana/gtrain-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, d := range []*prometheus.Desc{descJobInfo, descState, descStep, descLoss, descValLoss, descLR, descTokens,
		descStepTime, descWait, descMemory, descRestarts, descLost} {
		m := regexp.MustCompile(`fqName: "([a-z_]+)"`).FindStringSubmatch(d.String())
		served[m[1]] = true
	}
	used := regexp.MustCompile(`gtrain_[a-z_]+`).FindAllString(string(b), -1)
	if len(used) < 10 {
		t.Fatalf("the dashboard queries %d gtrain metrics: %v", len(used), used)
	}
	for _, name := range used {
		if !served[name] {
			t.Errorf("the dashboard queries %s, which the exporter does not serve", name)
		}
	}
}

package launch

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gtrain/gtrain/rendezvous"
)

// TestPerNodeSpareStoreOutage: a spare waiting for the next round waits
// as long as the store answers (no round starts here), and across an
// outage shorter than the limit; once the store has answered nothing for
// storeOutage, it stops with an error naming the store's endpoint and
// what to check. It waited for ever before.
func TestPerNodeSpareStoreOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &flakyStore{counters: map[string]int64{}}
		pn := &perNode{store: st, endpoint: "etcd-0:2379", etcd: &rendezvous.EtcdConfig{}, base: JobOptions{Heartbeat: time.Second}}
		limit := storeOutage(time.Second)
		ended := make(chan error, 1)
		go func() { ended <- pn.waitRound(t.Context(), 1) }()
		quiet := func(d time.Duration, when string) {
			time.Sleep(d)
			select {
			case err := <-ended:
				t.Fatalf("the spare stopped waiting %s: %v", when, err)
			default:
			}
		}
		quiet(time.Minute, "with the store up")
		st.setDown(true, false)
		quiet(limit-5*time.Second, "over an outage shorter than the limit")
		st.setDown(false, false)
		quiet(time.Minute, "after the store came back")

		st.setDown(true, false) // for good
		gone := time.Now()
		var err error
		select {
		case err = <-ended:
		case <-time.After(10 * time.Minute): // fake time: the bubble's clock
			t.Fatal("the spare still waits 10 minutes after the store went for good")
		}
		want := "etcd at etcd-0:2379 has not answered for "
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "check that etcd runs there") {
			t.Fatalf("the spare stopped with %v, want an error saying %q and what to check", err, want)
		}
		// The first failed request takes a beat to fail; each is a beat apart.
		if took := time.Since(gone); took < limit || took > limit+3*time.Second {
			t.Errorf("the spare stopped %v after the store went, want %v to %v", took, limit, limit+3*time.Second)
		}
	})
}

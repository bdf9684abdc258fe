// Package rendezvous will hold gtrain's membership rounds (who is in, node
// ranks, world size) and the small authenticated key-value store ranks use to
// meet: server, client, and a per-job secret. It arrives with the multi-host
// launcher (issue 3); until then a job runs on this machine only and node
// ranks come straight from the launch plan.
package rendezvous

// xchange: the kernel's TCP alone, as a 2-rank collective uses it: two
// processes exchange a message of M bytes each way per iteration over one
// connection, both sending and receiving at once with non-blocking calls
// (busy-polling, as Open MPI's tcp btl does), for M from M0 to M1 by
// factors of 2; the server prints the median, p10 and p90 time per
// iteration in µs. With CC set it first sets that congestion control on
// the socket (TCP_CONGESTION), so that BBR, CUBIC and reno can be compared
// on one link (docs/benchmarks.md, collectives across hosts).
// Usage: xchange server|client ADDR [iters] [write-max] [alt]
//   server listens on ADDR:29999, client connects to it; iters per size
//   (default 2000, after 20 warm-up); write-max bounds one send (default
//   1 MiB); alt 1 makes the exchange half-duplex (the server sends, then
//   the client). Environment: CC (congestion control), M0 and M1 (sizes,
//   default 32768 and 2097152).
// Run it between two network namespaces joined by a veth pair (as
// wakeup.c's header shows), e.g.
//   ip netns exec a env CC=reno ./xchange server 10.99.7.1 &
//   ip netns exec b env CC=reno ./xchange client 10.99.7.1
// Build: cc -O2 -o xchange docs/bench/peers/xchange.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static long env_long(const char *name, long def)
{
	const char *v = getenv(name);
	return v && *v ? atol(v) : def;
}

int main(int argc, char **argv)
{
	if (argc < 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: xchange server|client ADDR [iters] [write-max] [alt]\n");
		return 2;
	}
	int server = !strcmp(argv[1], "server");
	long iters = argc > 3 ? atol(argv[3]) : 2000, wmax = argc > 4 ? atol(argv[4]) : 1 << 20;
	int alt = argc > 5 && atoi(argv[5]);
	long m0 = env_long("M0", 32768), m1 = env_long("M1", 2 << 20);
	if (iters < 1 || iters > 1000000 || wmax < 1 || m0 < 1 || m1 < m0 || m1 > (1L << 30)) {
		fprintf(stderr, "xchange: iters 1..1e6, write-max >= 1, 1 <= M0 <= M1 <= 1 GiB\n");
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(29999)};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "xchange: %s: not an IPv4 address\n", argv[2]);
		return 2;
	}
	int fd, one = 1;
	if (server) {
		int l = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(l, (void *)&a, sizeof a) || listen(l, 1) || (fd = accept(l, 0, 0)) < 0) {
			perror("xchange: listen");
			return 1;
		}
		close(l);
	} else {
		for (int tries = 0;; tries++) {
			fd = socket(AF_INET, SOCK_STREAM, 0);
			if (!connect(fd, (void *)&a, sizeof a))
				break;
			close(fd);
			if (tries == 500) {
				perror("xchange: connect");
				return 1;
			}
			usleep(10000);
		}
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	const char *cc = getenv("CC");
	if (cc && *cc && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc))) {
		perror("xchange: TCP_CONGESTION");
		return 1;
	}
	fcntl(fd, F_SETFL, O_NONBLOCK);
	for (long m = m0; m <= m1; m *= 2) {
		char *s = malloc(m), *r = malloc(m);
		double *t = malloc(sizeof(double) * iters);
		if (!s || !r || !t) {
			fprintf(stderr, "xchange: out of memory at %ld bytes\n", m);
			return 1;
		}
		memset(s, 1, m);
		for (long it = -20; it < iters; it++) {
			double t0 = now_us();
			long w = 0, g = 0;
			while (w < m || g < m) {
				// Half-duplex: the client receives before it sends, the
				// server sends before it receives.
				if (w < m && (!alt || server || g >= m)) {
					ssize_t k = send(fd, s + w, m - w > wmax ? wmax : m - w, 0);
					if (k > 0)
						w += k;
				}
				if (g < m && (!alt || !server || w >= m)) {
					ssize_t k = recv(fd, r + g, m - g, 0);
					if (k > 0)
						g += k;
					else if (k == 0) {
						fprintf(stderr, "xchange: the peer closed the connection\n");
						return 1;
					}
				}
			}
			if (it >= 0)
				t[it] = now_us() - t0;
		}
		qsort(t, iters, sizeof(double), cmp);
		if (server)
			printf("%s M=%7ld per direction: median %.1f us  p10 %.1f  p90 %.1f\n", cc && *cc ? cc : "(system)", m,
			       t[iters / 2], t[iters / 10], t[iters * 9 / 10]);
		free(s);
		free(r);
		free(t);
	}
	return 0;
}

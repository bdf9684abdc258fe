/*
 * allreduce_mpi: in-place float32 MPI_SUM MPI_Allreduce over a range of sizes,
 * the Open MPI peer of docs/bench/collectives.sh.
 *
 * Usage: mpirun -np P allreduce_mpi MIN_BYTES MAX_BYTES [ITERS [WARMUP]]
 *   Sizes go from MIN_BYTES to MAX_BYTES by a factor of 2. ITERS 0 (default)
 *   means clamp(2^29 / size, 20, 1000): enough samples for a steady median
 *   at small sizes, no more than a few seconds at the largest. WARMUP
 *   defaults to 5.
 *
 * Each iteration is timed on its own, back to back after one barrier, as
 * gtrain bench collectives does, and an iteration's time is the maximum over
 * ranks: the
 * collective is done when the slowest rank is done. Rank 0 prints one JSON
 * line per size; algbw = size / median time and busbw = algbw * 2(p-1)/p, as
 * in nccl-tests.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static long auto_iters(long bytes)
{
	long n = (1L << 29) / bytes;
	return n < 20 ? 20 : n > 1000 ? 1000 : n;
}

/* fill writes a pattern of small integers with period 7: the sums stay exact,
 * so a wrong result is visible. */
static void fill(float *buf, long count, int rank)
{
	for (long i = 0; i < count; i++)
		buf[i] = (float)((rank + i) % 7);
}

/* check returns how many elements differ from the sum over ranks of fill()'s
 * data, as one all-reduce must leave it. */
static long check(const float *buf, long count, int nranks)
{
	float want[7] = {0};
	long wrong = 0;
	for (int j = 0; j < 7; j++)
		for (int r = 0; r < nranks; r++)
			want[j] += (float)((r + j) % 7);
	for (long i = 0; i < count; i++)
		wrong += buf[i] != want[i % 7];
	return wrong;
}

static void bench_size(long bytes, long iters, long warmup, int rank, int nranks)
{
	long count = bytes / (long)sizeof(float);
	float *buf = malloc((size_t)bytes);
	double *t = malloc((size_t)iters * sizeof(double));
	double *tmax = malloc((size_t)iters * sizeof(double));
	if (!buf || !t || !tmax) {
		fprintf(stderr, "allreduce_mpi: out of memory at %ld bytes\n", bytes);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	fill(buf, count, rank);
	MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	long wrong = check(buf, count, nranks), wrong_all = 0;
	MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

	for (long i = 0; i < warmup; i++)
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Barrier(MPI_COMM_WORLD);
	for (long i = 0; i < iters; i++) {
		double t0 = MPI_Wtime();
		MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		t[i] = MPI_Wtime() - t0;
	}
	MPI_Reduce(t, tmax, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

	if (rank == 0) {
		qsort(tmax, (size_t)iters, sizeof(double), cmp_double);
		double med = iters % 2 ? tmax[iters / 2]
				       : (tmax[iters / 2 - 1] + tmax[iters / 2]) / 2;
		double algbw = (double)bytes / med / 1e9;
		double busbw = algbw * 2.0 * (nranks - 1) / nranks;
		printf("{\"size_bytes\":%ld,\"count\":%ld,\"iters\":%ld,"
		       "\"time_us\":{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f},"
		       "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,\"wrong\":%ld}\n",
		       bytes, count, iters, med * 1e6, tmax[0] * 1e6,
		       tmax[iters - 1] * 1e6, algbw, busbw, wrong_all);
		fflush(stdout);
	}
	free(buf);
	free(t);
	free(tmax);
}

int main(int argc, char **argv)
{
	int rank, nranks;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (argc < 3 || argc > 5) {
		if (rank == 0)
			fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES [ITERS [WARMUP]]\n", argv[0]);
		MPI_Finalize();
		return 2;
	}
	long min = atol(argv[1]), max = atol(argv[2]);
	long iters = argc > 3 ? atol(argv[3]) : 0;
	long warmup = argc > 4 ? atol(argv[4]) : 5;
	if (min < (long)sizeof(float) || max < min || max > (long)sizeof(float) * 0x7fffffffL ||
	    iters < 0 || warmup < 0) {
		if (rank == 0)
			fprintf(stderr, "allreduce_mpi: bad sizes or counts\n");
		MPI_Finalize();
		return 2;
	}
	for (long bytes = min; bytes <= max; bytes *= 2)
		bench_size(bytes, iters ? iters : auto_iters(bytes), warmup, rank, nranks);
	MPI_Finalize();
	return 0;
}

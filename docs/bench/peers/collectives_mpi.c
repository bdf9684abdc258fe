/*
 * collectives_mpi: float32 MPI_SUM all-reduce (in place), reduce-scatter
 * (MPI_Reduce_scatter_block) and all-gather (MPI_Allgather), out of place,
 * over a range of sizes: the Open MPI peer of docs/bench/collectives_hosts.sh.
 *
 * Usage: mpirun -np P collectives_mpi MIN_BYTES MAX_BYTES [ITERS [WARMUP]]
 *   A size is the whole buffer, as gtrain bench collectives counts it: the
 *   all-reduce buffer, the reduce-scatter input, the all-gather output (each
 *   rank's block is size/P). Sizes go by a factor of 2 and must divide by
 *   4P. ITERS 0 (default) means clamp(2^29 / size, 20, 1000); WARMUP
 *   defaults to 5.
 *
 * Timing as allreduce_mpi.c: each iteration on its own after one barrier,
 * its time the maximum over ranks. Rank 0 prints one JSON line per
 * collective and size; busbw = algbw * 2(p-1)/p for all-reduce and
 * algbw * (p-1)/p for the others (nccl-tests).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, NCOLL };
static const char *names[NCOLL] = {"all_reduce", "reduce_scatter", "all_gather"};

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

static void run(int coll, float *in, float *out, long count, int nranks)
{
	int block = (int)(count / nranks);
	switch (coll) {
	case ALL_REDUCE:
		MPI_Allreduce(MPI_IN_PLACE, in, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		break;
	case REDUCE_SCATTER:
		MPI_Reduce_scatter_block(in, out, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		break;
	case ALL_GATHER:
		MPI_Allgather(in, block, MPI_FLOAT, out, block, MPI_FLOAT, MPI_COMM_WORLD);
		break;
	}
}

/* wrong counts the elements that differ from the exact result of one call
 * on fill's data: in[i] = (rank + i) % 7 for all-reduce and reduce-scatter
 * (sums of small integers are exact), rank + 1 for all-gather. */
static long wrong(int coll, const float *in, const float *out, long count, int rank, int nranks)
{
	long block = count / nranks, bad = 0;
	for (long i = 0; i < (coll == ALL_REDUCE ? count : block * (coll == ALL_GATHER ? nranks : 1)); i++) {
		long g = coll == REDUCE_SCATTER ? rank * block + i : i;
		float want = 0;
		if (coll == ALL_GATHER)
			want = (float)(i / block + 1);
		else
			for (int r = 0; r < nranks; r++)
				want += (float)((r + g) % 7);
		bad += (coll == ALL_REDUCE ? in[i] : out[i]) != want;
	}
	return bad;
}

static void fill(int coll, float *in, long count, int rank)
{
	for (long i = 0; i < count; i++)
		in[i] = coll == ALL_GATHER ? (float)(rank + 1) : (float)((rank + i) % 7);
}

static void bench(int coll, long bytes, long iters, long warmup, int rank, int nranks)
{
	long count = bytes / (long)sizeof(float);
	float *in = malloc((size_t)bytes), *out = malloc((size_t)bytes);
	double *t = malloc((size_t)iters * sizeof(double)), *tmax = malloc((size_t)iters * sizeof(double));
	if (!in || !out || !t || !tmax) {
		fprintf(stderr, "collectives_mpi: out of memory at %ld bytes\n", bytes);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	memset(out, 0, (size_t)bytes);
	fill(coll, in, count, rank);
	run(coll, in, out, count, nranks);
	long bad = wrong(coll, in, out, count, rank, nranks), bad_all = 0;
	MPI_Reduce(&bad, &bad_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
	for (long i = 0; i < warmup; i++)
		run(coll, in, out, count, nranks);
	MPI_Barrier(MPI_COMM_WORLD);
	for (long i = 0; i < iters; i++) {
		double t0 = MPI_Wtime();
		run(coll, in, out, count, nranks);
		t[i] = MPI_Wtime() - t0;
	}
	MPI_Reduce(t, tmax, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		double sum = 0;
		for (long i = 0; i < iters; i++)
			sum += tmax[i];
		qsort(tmax, (size_t)iters, sizeof(double), cmp_double);
		double med = iters % 2 ? tmax[iters / 2] : (tmax[iters / 2 - 1] + tmax[iters / 2]) / 2;
		double algbw = (double)bytes / med / 1e9;
		double factor = (coll == ALL_REDUCE ? 2.0 : 1.0) * (nranks - 1) / nranks;
		printf("{\"collective\":\"%s\",\"size_bytes\":%ld,\"count\":%ld,\"iters\":%ld,"
		       "\"time_us\":{\"median\":%.3f,\"mean\":%.3f,\"min\":%.3f,\"max\":%.3f},"
		       "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,\"wrong\":%ld}\n",
		       names[coll], bytes, count, iters, med * 1e6, sum / (double)iters * 1e6, tmax[0] * 1e6,
		       tmax[iters - 1] * 1e6, algbw, algbw * factor, bad_all);
		fflush(stdout);
	}
	free(in);
	free(out);
	free(t);
	free(tmax);
}

int main(int argc, char **argv)
{
	int rank, nranks;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	long min = argc > 2 ? atol(argv[1]) : 0, max = argc > 2 ? atol(argv[2]) : 0;
	long iters = argc > 3 ? atol(argv[3]) : 0, warmup = argc > 4 ? atol(argv[4]) : 5;
	if (argc < 3 || argc > 5 || min < 4L * nranks || max < min || max > 0x7fffffffL ||
	    min % (4L * nranks) || iters < 0 || iters > 1000000 || warmup < 0 || warmup > 1000000) {
		if (rank == 0)
			fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES [ITERS [WARMUP]] (sizes multiples of 4 x ranks, below 2 GiB)\n", argv[0]);
		MPI_Finalize();
		return 2;
	}
	for (int coll = 0; coll < NCOLL; coll++)
		for (long bytes = min; bytes <= max; bytes *= 2)
			bench(coll, bytes, iters ? iters : auto_iters(bytes), warmup, rank, nranks);
	MPI_Finalize();
	return 0;
}

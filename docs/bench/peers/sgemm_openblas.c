/*
 * The OpenBLAS peer of gtrain's BenchmarkSgemm (engine/kernels): times
 * cblas_sgemm, row-major, on the shapes named on the command line and prints
 * one JSON line per shape and thread count.
 *
 *   cc -O2 -o sgemm_openblas sgemm_openblas.c -lopenblas
 *   ./sgemm_openblas [-threads 1,2] [-benchtime SECONDS] SHAPE...
 *
 * A SHAPE is spelled as gtrain's sub-benchmark names are:
 * <op(A)><op(B)>_<m>x<n>x<k>[_ld<lda>,<ldb>,<ldc>], op N or T, for example
 * NN_1024x2304x768 or NT_1024x1024x64_ld2304,2304,1024. Without _ld the
 * strides are the logical widths. alpha = 1, beta = 0, as in a forward pass.
 *
 * The timing copies Go's testing.B, so that the two columns compare: one
 * untimed call (buffers touched, the thread pool started), then rounds of n
 * calls timed as a whole, n growing from 1 until a round lasts at least the
 * benchtime (default 0.3 s); the last round's time per call is the figure.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Declared in OpenBLAS's cblas.h; repeated so that a reader sees them. */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
char *openblas_get_config(void);

struct shape {
	const char *name;
	int ta, tb, m, n, k, lda, ldb, ldc;
};

static int parse_shape(const char *s, struct shape *sh) {
	char a, b;
	int used = 0;
	sh->name = s;
	if (sscanf(s, "%c%c_%dx%dx%d%n", &a, &b, &sh->m, &sh->n, &sh->k, &used) != 5)
		return -1;
	if ((a != 'N' && a != 'T') || (b != 'N' && b != 'T') || sh->m < 1 || sh->n < 1 || sh->k < 1)
		return -1;
	sh->ta = a == 'T';
	sh->tb = b == 'T';
	/* Row-major: a stored row is k wide for A, m wide for A^T; and so on. */
	sh->lda = sh->ta ? sh->m : sh->k;
	sh->ldb = sh->tb ? sh->k : sh->n;
	sh->ldc = sh->n;
	if (s[used] == '\0')
		return 0;
	if (sscanf(s + used, "_ld%d,%d,%d", &sh->lda, &sh->ldb, &sh->ldc) != 3)
		return -1;
	if (sh->lda < (sh->ta ? sh->m : sh->k) || sh->ldb < (sh->tb ? sh->k : sh->n) || sh->ldc < sh->n)
		return -1;
	return 0;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *filled(size_t len) {
	float *p = malloc(len * sizeof(float));
	if (p == NULL) {
		fprintf(stderr, "sgemm_openblas: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < len; i++)
		p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	return p;
}

static void run(const struct shape *sh, int threads, double benchtime) {
	size_t arows = sh->ta ? sh->k : sh->m, brows = sh->tb ? sh->n : sh->k;
	float *a = filled(arows * sh->lda), *b = filled(brows * sh->ldb), *c = filled((size_t)sh->m * sh->ldc);
	enum CBLAS_TRANSPOSE ta = sh->ta ? CblasTrans : CblasNoTrans, tb = sh->tb ? CblasTrans : CblasNoTrans;
	long n = 1, i;
	double t = 0;

	openblas_set_num_threads(threads);
	cblas_sgemm(CblasRowMajor, ta, tb, sh->m, sh->n, sh->k, 1, a, sh->lda, b, sh->ldb, 0, c, sh->ldc);
	for (;;) {
		double t0 = now();
		for (i = 0; i < n; i++)
			cblas_sgemm(CblasRowMajor, ta, tb, sh->m, sh->n, sh->k, 1, a, sh->lda, b, sh->ldb, 0, c, sh->ldc);
		t = now() - t0;
		if (t >= benchtime || n >= 1000000000)
			break;
		/* As testing.B: aim 20% past the benchtime, grow at most 100x. */
		long next = t > 0 ? (long)(1.2 * benchtime / (t / n)) : 100 * n;
		if (next > 100 * n)
			next = 100 * n;
		n = next > n ? next : n + 1;
	}
	double ns = t / n * 1e9, flops = 2.0 * sh->m * sh->n * sh->k;
	printf("{\"shape\":\"%s\",\"threads\":%d,\"iters\":%ld,\"ns_per_op\":%.0f,\"gflops\":%.2f}\n", sh->name, threads, n,
	       ns, flops / ns);
	fflush(stdout);
	free(a);
	free(b);
	free(c);
}

int main(int argc, char **argv) {
	int threads[8], nthreads = 0, i;
	double benchtime = 0.3;
	char *list = "1";

	for (i = 1; i < argc && argv[i][0] == '-'; i += 2) {
		if (i + 1 >= argc)
			goto usage;
		if (strcmp(argv[i], "-threads") == 0)
			list = argv[i + 1];
		else if (strcmp(argv[i], "-benchtime") == 0)
			benchtime = atof(argv[i + 1]);
		else
			goto usage;
	}
	if (i >= argc || benchtime <= 0)
		goto usage;
	for (char *s = strtok(list, ","); s != NULL && nthreads < 8; s = strtok(NULL, ","))
		if ((threads[nthreads++] = atoi(s)) < 1)
			goto usage;
	fprintf(stderr, "sgemm_openblas: OpenBLAS core %s; %s\n", openblas_get_corename(), openblas_get_config());
	for (; i < argc; i++) {
		struct shape sh;
		if (parse_shape(argv[i], &sh) != 0) {
			fprintf(stderr, "sgemm_openblas: bad shape %s\n", argv[i]);
			return 2;
		}
		for (int t = 0; t < nthreads; t++)
			run(&sh, threads[t], benchtime);
	}
	return 0;
usage:
	fprintf(stderr, "usage: sgemm_openblas [-threads 1,2] [-benchtime SECONDS] SHAPE...\n");
	return 2;
}

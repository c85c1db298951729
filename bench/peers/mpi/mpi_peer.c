/*
 * mpi_peer: the Open MPI side of bench/peers. It runs, between the ranks of
 * one MPI job, the same measurements as bench/peers' gdist worker (and as
 * examples/transport_bench and bench/collectives): an 8-byte and a 128 KiB
 * ping-pong, one-way streams, and in-place float32 sum all-reduces, and
 * prints one JSON line per figure on rank 0's stdout, prefixed "RESULT ".
 *
 * Build and run (bench/peers/run.sh does both):
 *
 *     mpicc -O2 -o mpi_peer bench/peers/mpi/mpi_peer.c
 *     mpirun --allow-run-as-root -np 2 --mca pml ob1 --mca btl self,vader ./mpi_peer
 *
 * Arguments, each key=value (the defaults in brackets):
 *     pp_sizes=8,131072   ping-pong message sizes in bytes
 *     pp_iters=20000      timed round trips per ping-pong size [20000]
 *     pp_warmup=2000      untimed round trips before them
 *     stream_sizes=65536,1048576,16777216
 *     stream_mib=256      MiB per stream (at least 8 messages)
 *     ar_sizes=16384,262144,1048576,4194304,16777216   all-reduce bytes
 *     ar_iters=200        timed all-reduces per size (at least 20, fewer
 *                         above 1 MiB: iters * 1 MiB / size)
 *     ar_warmup=10        untimed all-reduces per size
 *
 * Timing follows the Go worker exactly: each round trip and each all-reduce
 * is timed on its own with CLOCK_MONOTONIC and the median is reported (the
 * machine is shared and noisy); a stream is timed from a barrier to the
 * receiver's one-byte acknowledgement after the last message, after a
 * warm-up of a tenth as many messages. All-reduce inputs are small integers
 * refilled before every call, so every result is exact and checked (wrong).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXLIST 32

static double now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n) {
	qsort(v, n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int parse_list(const char *s, long *out) {
	int n = 0;
	while (*s && n < MAXLIST) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 1) {
			return -1;
		}
		out[n++] = v;
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

/* Deterministic small-integer input: sums over the ranks are exact. */
static float input(int rank, long i) { return (float)((rank * 31 + i * 17) % 61 - 30); }

struct opts {
	long pp_sizes[MAXLIST], stream_sizes[MAXLIST], ar_sizes[MAXLIST];
	int npp, nstream, nar;
	long pp_iters, pp_warmup, stream_mib, ar_iters, ar_warmup;
};

static int parse_args(int argc, char **argv, struct opts *o) {
	const char *pp = "8,131072", *st = "65536,1048576,16777216",
		   *ar = "16384,262144,1048576,4194304,16777216";
	o->pp_iters = 20000;
	o->pp_warmup = 2000;
	o->stream_mib = 256;
	o->ar_iters = 200;
	o->ar_warmup = 10;
	for (int i = 1; i < argc; i++) {
		char *eq = strchr(argv[i], '=');
		if (!eq) {
			return -1;
		}
		*eq = 0;
		const char *k = argv[i], *v = eq + 1;
		if (!strcmp(k, "pp_sizes")) pp = v;
		else if (!strcmp(k, "stream_sizes")) st = v;
		else if (!strcmp(k, "ar_sizes")) ar = v;
		else if (!strcmp(k, "pp_iters")) o->pp_iters = atol(v);
		else if (!strcmp(k, "pp_warmup")) o->pp_warmup = atol(v);
		else if (!strcmp(k, "stream_mib")) o->stream_mib = atol(v);
		else if (!strcmp(k, "ar_iters")) o->ar_iters = atol(v);
		else if (!strcmp(k, "ar_warmup")) o->ar_warmup = atol(v);
		else return -1;
	}
	o->npp = parse_list(pp, o->pp_sizes);
	o->nstream = parse_list(st, o->stream_sizes);
	o->nar = parse_list(ar, o->ar_sizes);
	if (o->npp < 0 || o->nstream < 0 || o->nar < 0 || o->pp_iters < 1 || o->stream_mib < 1 ||
	    o->ar_iters < 1 || o->pp_warmup < 0 || o->ar_warmup < 0) {
		return -1;
	}
	return 0;
}

enum { TAG_PING = 2, TAG_STREAM = 3, TAG_ACK = 4 };

static void pingpong(int rank, long size, const struct opts *o) {
	char *buf = calloc(size, 1);
	double *lat = malloc(o->pp_iters * sizeof *lat);
	int other = 1 - rank;
	MPI_Barrier(MPI_COMM_WORLD);
	for (long i = 0; i < o->pp_warmup + o->pp_iters; i++) {
		if (rank == 0) {
			double t0 = now_ns();
			MPI_Send(buf, size, MPI_BYTE, other, TAG_PING, MPI_COMM_WORLD);
			MPI_Recv(buf, size, MPI_BYTE, other, TAG_PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			if (i >= o->pp_warmup) {
				lat[i - o->pp_warmup] = now_ns() - t0;
			}
		} else if (rank == 1) {
			MPI_Recv(buf, size, MPI_BYTE, other, TAG_PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(buf, size, MPI_BYTE, other, TAG_PING, MPI_COMM_WORLD);
		}
	}
	if (rank == 0) {
		double sum = 0;
		for (long i = 0; i < o->pp_iters; i++) {
			sum += lat[i];
		}
		double med = median(lat, o->pp_iters);
		printf("RESULT {\"kind\":\"pingpong\",\"bytes\":%ld,\"median_us\":%.4f,\"mean_us\":%.4f}\n",
		       size, med / 1e3, sum / o->pp_iters / 1e3);
	}
	free(lat);
	free(buf);
}

/* stream_once sends n messages of size bytes from rank 0 to rank 1 and
 * returns the nanoseconds until rank 1's acknowledgement arrived. */
static double stream_once(int rank, char *buf, long size, long n) {
	char ack = 1;
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = now_ns();
	if (rank == 0) {
		for (long i = 0; i < n; i++) {
			MPI_Send(buf, size, MPI_BYTE, 1, TAG_STREAM, MPI_COMM_WORLD);
		}
		MPI_Recv(&ack, 1, MPI_BYTE, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	} else if (rank == 1) {
		for (long i = 0; i < n; i++) {
			MPI_Recv(buf, size, MPI_BYTE, 0, TAG_STREAM, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		}
		MPI_Send(&ack, 1, MPI_BYTE, 0, TAG_ACK, MPI_COMM_WORLD);
	}
	return now_ns() - t0;
}

static void stream(int rank, long size, const struct opts *o) {
	long n = o->stream_mib * (1L << 20) / size;
	if (n < 8) {
		n = 8;
	}
	char *buf = calloc(size, 1);
	stream_once(rank, buf, size, n / 10 > 2 ? n / 10 : 2);
	double d = stream_once(rank, buf, size, n);
	if (rank == 0) {
		printf("RESULT {\"kind\":\"stream\",\"bytes\":%ld,\"gbps\":%.4f}\n", size, (double)size * n / d);
	}
	free(buf);
}

static void allreduce(int rank, int world, long bytes, const struct opts *o) {
	long count = bytes / 4;
	long iters = o->ar_iters;
	if (bytes > (1L << 20)) {
		iters = iters * (1L << 20) / bytes;
	}
	if (iters < 20) {
		iters = 20;
	}
	float *x = malloc(count * sizeof *x);
	double *lat = malloc(iters * sizeof *lat);
	for (long i = 0; i < o->ar_warmup + iters; i++) {
		for (long k = 0; k < count; k++) {
			x[k] = input(rank, k);
		}
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = now_ns();
		MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		if (i >= o->ar_warmup) {
			lat[i - o->ar_warmup] = now_ns() - t0;
		}
	}
	long wrong = 0;
	for (long k = 0; k < count; k++) {
		float want = 0;
		for (int r = 0; r < world; r++) {
			want += input(r, k);
		}
		wrong += x[k] != want;
	}
	double med = median(lat, iters), slowest;
	MPI_Allreduce(&med, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	long allwrong;
	MPI_Allreduce(&wrong, &allwrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0) {
		double busbw = (double)bytes / slowest * 2.0 * (world - 1) / world; /* bytes/ns = GB/s */
		printf("RESULT {\"kind\":\"allreduce\",\"bytes\":%ld,\"median_us\":%.4f,\"busbw\":%.4f,\"wrong\":%ld}\n",
		       bytes, slowest / 1e3, busbw, allwrong);
	}
	free(lat);
	free(x);
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, world;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	struct opts o;
	if (parse_args(argc, argv, &o) != 0) {
		if (rank == 0) {
			fprintf(stderr, "mpi_peer: bad arguments (see the comment at the top of mpi_peer.c)\n");
		}
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	if (world < 2) {
		if (rank == 0) {
			fprintf(stderr, "mpi_peer: needs at least 2 ranks\n");
		}
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	for (int i = 0; i < o.npp; i++) {
		pingpong(rank, o.pp_sizes[i], &o);
	}
	for (int i = 0; i < o.nstream; i++) {
		stream(rank, o.stream_sizes[i], &o);
	}
	for (int i = 0; i < o.nar; i++) {
		allreduce(rank, world, o.ar_sizes[i], &o);
	}
	fflush(stdout);
	MPI_Finalize();
	return 0;
}

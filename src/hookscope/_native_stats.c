/* One memory pass over a dense float32 or float64 array: sum, sum of squares, min, max and the
 * number of zeros (+0.0 and -0.0), for hookscope's CPU statistics (see hookscope/_native.py).
 *
 * Portable C with GCC/Clang vector extensions; HS_VBYTES is the vector width in bytes (32 with
 * AVX2, 16 otherwise). The array is reduced in chunks of CHUNK elements whose partial results are
 * added in float64. Inside a chunk, float32 values are summed in vector lanes over blocks of BLOCK
 * elements, and each block's lane sums are added in float64. NaN and Inf are not special-cased: they make the sums non-finite,
 * and the caller then takes its exact slow path.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef HS_VBYTES
#define HS_VBYTES 16
#endif
#define CHUNK 65536
#define BLOCK 512

typedef struct { double sum, sq, lo, hi; int64_t zeros; } part_t;

#define WF (HS_VBYTES / 4)
#define WD (HS_VBYTES / 8)
typedef float vf __attribute__((vector_size(HS_VBYTES)));
typedef int32_t vi __attribute__((vector_size(HS_VBYTES)));
typedef double vd __attribute__((vector_size(HS_VBYTES)));
typedef int64_t vl __attribute__((vector_size(HS_VBYTES)));

static inline vf pick_f(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }
static inline vd pick_d(vl m, vd a, vd b) { return (vd)((m & (vl)a) | (~m & (vl)b)); }

/* Four vectors per step, each into its own accumulators: one chain of dependent adds would wait
 * on the add's latency (4-5 cycles) at every step. */
#define U 4

static void chunk_f32(const float *p, int64_t n, part_t *out) {
    vf up = {0}, down = {0}, lo[U], hi[U];
    vi z[U];
    for (int k = 0; k < WF; k++) { up[k] = __builtin_inff(); down[k] = -__builtin_inff(); }
    for (int u = 0; u < U; u++) { lo[u] = up; hi[u] = down; z[u] = (vi){0}; }
    double sum = 0, sq = 0;
    int64_t i = 0, whole = n - n % (U * WF);
    while (i < whole) {
        int64_t end = i + BLOCK < whole ? i + BLOCK : whole;
        vf s[U], q[U];
        for (int u = 0; u < U; u++) { s[u] = (vf){0}; q[u] = (vf){0}; }
        for (; i < end; i += U * WF) {
            for (int u = 0; u < U; u++) {
                vf v;
                memcpy(&v, p + i + u * WF, sizeof v);
                s[u] += v;
                q[u] += v * v;
                lo[u] = pick_f(v < lo[u], v, lo[u]);
                hi[u] = pick_f(v > hi[u], v, hi[u]);
                z[u] -= (v == 0);
            }
        }
        for (int u = 0; u < U; u++) {
            for (int k = 0; k < WF; k++) { sum += s[u][k]; sq += q[u][k]; }
        }
    }
    double l = __builtin_inf(), h = -__builtin_inf();
    int64_t zeros = 0;
    for (int u = 0; u < U; u++) {
        for (int k = 0; k < WF; k++) {
            if (lo[u][k] < l) l = lo[u][k];
            if (hi[u][k] > h) h = hi[u][k];
            zeros += z[u][k];
        }
    }
    for (; i < n; i++) {
        float v = p[i];
        sum += v;
        sq += (double)v * v;
        if (v < l) l = v;
        if (v > h) h = v;
        zeros += v == 0;
    }
    *out = (part_t){sum, sq, l, h, zeros};
}

static void chunk_f64(const double *p, int64_t n, part_t *out) {
    vd lo, hi, s = {0}, q = {0};
    vl z = {0};
    for (int k = 0; k < WD; k++) { lo[k] = __builtin_inf(); hi[k] = -__builtin_inf(); }
    int64_t i = 0, whole = n - n % WD;
    for (; i < whole; i += WD) {
        vd v;
        memcpy(&v, p + i, sizeof v);
        s += v;
        q += v * v;
        lo = pick_d(v < lo, v, lo);
        hi = pick_d(v > hi, v, hi);
        z -= (v == 0);
    }
    double sum = 0, sq = 0, l = __builtin_inf(), h = -__builtin_inf();
    int64_t zeros = 0;
    for (int k = 0; k < WD; k++) {
        sum += s[k];
        sq += q[k];
        if (lo[k] < l) l = lo[k];
        if (hi[k] > h) h = hi[k];
        zeros += z[k];
    }
    for (; i < n; i++) {
        double v = p[i];
        sum += v;
        sq += v * v;
        if (v < l) l = v;
        if (v > h) h = v;
        zeros += v == 0;
    }
    *out = (part_t){sum, sq, l, h, zeros};
}

/* The sums of (x - mean) and (x - mean)^2 in float64, for data whose one-pass variance would cancel. */
static void chunk_centred(const void *data, int wide, int64_t n, double mean, part_t *out) {
    double s[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int k = 0; k < 4; k++) {
            double d = (wide ? ((const double *)data)[i + k] : ((const float *)data)[i + k]) - mean;
            s[k] += d;
            q[k] += d * d;
        }
    }
    for (; i < n; i++) {
        double d = (wide ? ((const double *)data)[i] : ((const float *)data)[i]) - mean;
        s[0] += d;
        q[0] += d * d;
    }
    *out = (part_t){(s[0] + s[1]) + (s[2] + s[3]), (q[0] + q[1]) + (q[2] + q[3]), 0, 0, 0};
}

/* OpenMP's GOMP_parallel, taken from the runtime torch itself loaded (hs_use_openmp): the chunks
 * are then shared with torch's own worker threads, which are spinning, idle, between torch's ops.
 * Threads of our own would share a core with a spinning worker and make the whole call wait for
 * the time slice it lost (measured: 186 ms per resnet50 forward at batch 8, against 56 ms on one
 * thread and 36 ms with torch's workers). */
typedef void (*gomp_parallel_t)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
static gomp_parallel_t gomp_parallel;

void hs_use_openmp(void *fn) { gomp_parallel = (gomp_parallel_t)fn; }

typedef struct {
    const char *p;
    int wide, centred;
    double mean;
    int64_t n, chunks, next;  /* next: the next chunk to take, shared by the threads */
    part_t *parts;
} job_t;

static void work(void *arg) {
    job_t *j = arg;
    size_t size = j->wide ? sizeof(double) : sizeof(float);
    for (;;) {
        int64_t c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (c >= j->chunks) break;
        int64_t start = c * CHUNK, len = start + CHUNK < j->n ? CHUNK : j->n - start;
        const void *at = j->p + start * size;
        if (j->centred) chunk_centred(at, j->wide, len, j->mean, j->parts + c);
        else if (j->wide) chunk_f64(at, len, j->parts + c);
        else chunk_f32(at, len, j->parts + c);
    }
}

/* out = {sum, sum of squares, min, max, zeros} (centred: {sum of x - mean, of its square, 0, 0, 0}).
 * The chunks' partial results are added in chunk order, so the answer does not depend on the number
 * of threads or on which thread took which chunk. Returns -1 if the partial results could not be
 * allocated, else 0. */
static int reduce(const void *p, int wide, int centred, double mean, int64_t n, int threads, double *out) {
    int64_t chunks = (n + CHUNK - 1) / CHUNK;
    part_t one, *parts = chunks > 1 ? malloc((size_t)chunks * sizeof *parts) : &one;
    if (parts == NULL) return -1;
    job_t job = {p, wide, centred, mean, n, chunks, 0, parts};
    if (threads > 1 && chunks > 1 && gomp_parallel != NULL) gomp_parallel(work, &job, (unsigned)threads, 0);
    else work(&job);
    double sum = 0, sq = 0, lo = __builtin_inf(), hi = -__builtin_inf();
    int64_t zeros = 0;
    for (int64_t c = 0; c < chunks; c++) {
        sum += parts[c].sum;
        sq += parts[c].sq;
        zeros += parts[c].zeros;
        if (parts[c].lo < lo) lo = parts[c].lo;
        if (parts[c].hi > hi) hi = parts[c].hi;
    }
    if (parts != &one) free(parts);
    out[0] = sum;
    out[1] = sq;
    out[2] = lo;
    out[3] = hi;
    out[4] = (double)zeros;
    return 0;
}

int hs_stats(const void *p, int wide, int64_t n, int threads, double *out) {
    return reduce(p, wide, 0, 0.0, n, threads, out);
}

int hs_centred(const void *p, int wide, int64_t n, double mean, int threads, double *out) {
    return reduce(p, wide, 1, mean, n, threads, out);
}

/* One memory pass over a dense float32 or float64 array: sum, sum of squares, min, max and the
 * number of zeros (+0.0 and -0.0), and on request those of its positive part (what ReLU makes of it),
 * for hookscope's CPU statistics (see hookscope/_native.py).
 *
 * Portable C with GCC/Clang vector extensions; HS_VBYTES is the vector width in bytes (32 with
 * AVX2, 16 otherwise). The array is reduced in chunks of CHUNK elements whose partial results are
 * added in float64. Inside a chunk, float32 values are summed in vector lanes over blocks of BLOCK
 * elements, and each block's lane sums are added in float64. NaN and Inf are not special-cased: they make the sums non-finite,
 * and the caller then takes its exact slow path.
 *
 * setup.py builds it at install time as hookscope/_native_lib/_native_stats (16-byte vectors)
 * and, on x86-64, _native_lib/_native_stats_avx2 (-mavx2 -mfma, 32-byte vectors). They are plain
 * shared libraries with no Python module in them (so no Python headers are needed to build them):
 * hookscope._native finds the file beside itself and calls the hs_* functions through ctypes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef HS_VBYTES
#define HS_VBYTES 16
#endif
#define CHUNK 65536
#define BLOCK 512

/* psum, psq, negative: the sums of max(v, 0) and its square, and the count of v < 0 (relu only). */
typedef struct { double sum, sq, lo, hi; int64_t zeros; double psum, psq; int64_t negative; } part_t;

#define WF (HS_VBYTES / 4)
#define WD (HS_VBYTES / 8)
typedef float vf __attribute__((vector_size(HS_VBYTES)));
typedef int32_t vi __attribute__((vector_size(HS_VBYTES)));
typedef double vd __attribute__((vector_size(HS_VBYTES)));
typedef int64_t vl __attribute__((vector_size(HS_VBYTES)));

static inline vf pick_f(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }
/* v < m ? v : m and v > m ? v : m: one instruction on x86 (minps/maxps return their second operand
 * when the comparison is false, as these do). */
#if defined(__AVX__) && HS_VBYTES == 32
#include <immintrin.h>
#define MIN_F(v, m) ((vf)_mm256_min_ps((__m256)(v), (__m256)(m)))
#define MAX_F(v, m) ((vf)_mm256_max_ps((__m256)(v), (__m256)(m)))
#elif defined(__SSE2__) && HS_VBYTES == 16
#include <immintrin.h>
#define MIN_F(v, m) ((vf)_mm_min_ps((__m128)(v), (__m128)(m)))
#define MAX_F(v, m) ((vf)_mm_max_ps((__m128)(v), (__m128)(m)))
#else
#define MIN_F(v, m) pick_f((v) < (m), (v), (m))
#define MAX_F(v, m) pick_f((v) > (m), (v), (m))
#endif
static inline vd pick_d(vl m, vd a, vd b) { return (vd)((m & (vl)a) | (~m & (vl)b)); }

/* Four vectors per step, each into its own accumulators: one chain of dependent adds would wait
 * on the add's latency (4-5 cycles) at every step. */
#define U 4

/* The positive part max(v, 0) of each vector, summed and squared in lanes of their own, and the
 * negative values counted: the statistics ReLU's output will have, without reading it (see
 * hs_stats). max(v, 0) is +0.0 where ReLU keeps -0.0; a lane's sum, started at +0.0, never becomes
 * -0.0, so adding either leaves the same bits. */
static void relu_block(const float *p, int64_t i, int64_t end, double *ls, double *lq, vi *neg) {
    vf s[U], q[U], zero = {0};
    for (int u = 0; u < U; u++) { s[u] = zero; q[u] = zero; }
    for (; i < end; i += U * WF) {
        for (int u = 0; u < U; u++) {
            vf v;
            memcpy(&v, p + i + u * WF, sizeof v);
            vf m = MAX_F(v, zero);
            s[u] += m;
            q[u] += m * m;
            neg[u] -= (v < zero);
        }
    }
    for (int u = 0; u < U; u++) {
        for (int k = 0; k < WF; k++) { ls[u * WF + k] += s[u][k]; lq[u * WF + k] += q[u][k]; }
    }
}

static void chunk_f32(const float *p, int64_t n, int relu, part_t *out) {
    vf up = {0}, down = {0}, lo[U], hi[U];
    vi z[U], neg[U];
    for (int k = 0; k < WF; k++) { up[k] = __builtin_inff(); down[k] = -__builtin_inff(); }
    for (int u = 0; u < U; u++) { lo[u] = up; hi[u] = down; z[u] = neg[u] = (vi){0}; }
    double ls[U * WF] = {0}, lq[U * WF] = {0}, rs[U * WF] = {0}, rq[U * WF] = {0};
    int64_t i = 0, whole = n - n % (U * WF);
    /* Each block is read two or three times while it is in L1: the sums, the positive part's sums
     * (relu), then the extremes and zeros. One loop for all would need 20 or more vector
     * accumulators, more than the 16 registers of AVX2, and spill them to the stack at every step. */
    while (i < whole) {
        int64_t end = i + BLOCK < whole ? i + BLOCK : whole;
        vf s[U], q[U];
        for (int u = 0; u < U; u++) { s[u] = (vf){0}; q[u] = (vf){0}; }
        for (int64_t j = i; j < end; j += U * WF) {
            for (int u = 0; u < U; u++) {
                vf v;
                memcpy(&v, p + j + u * WF, sizeof v);
                s[u] += v;
                q[u] += v * v;
            }
        }
        for (int u = 0; u < U; u++) {  /* independent adds: no chain waiting on the add's latency */
            for (int k = 0; k < WF; k++) { ls[u * WF + k] += s[u][k]; lq[u * WF + k] += q[u][k]; }
        }
        if (relu) relu_block(p, i, end, rs, rq, neg);
        for (; i < end; i += U * WF) {
            for (int u = 0; u < U; u++) {
                vf v;
                memcpy(&v, p + i + u * WF, sizeof v);
                lo[u] = MIN_F(v, lo[u]);
                hi[u] = MAX_F(v, hi[u]);
                z[u] -= (v == 0);
            }
        }
    }
    double sum = 0, sq = 0, psum = 0, psq = 0, l = __builtin_inf(), h = -__builtin_inf();
    int64_t zeros = 0, negative = 0;
    for (int k = 0; k < U * WF; k++) { sum += ls[k]; sq += lq[k]; psum += rs[k]; psq += rq[k]; }
    for (int u = 0; u < U; u++) {
        for (int k = 0; k < WF; k++) {
            if (lo[u][k] < l) l = lo[u][k];
            if (hi[u][k] > h) h = hi[u][k];
            zeros += z[u][k];
            negative += neg[u][k];
        }
    }
    for (; i < n; i++) {
        float v = p[i], m = v > 0 ? v : 0.0f;
        sum += v;
        sq += (double)v * v;
        psum += m;
        psq += (double)m * m;
        if (v < l) l = v;
        if (v > h) h = v;
        zeros += v == 0;
        negative += v < 0;
    }
    *out = (part_t){sum, sq, l, h, zeros, psum, psq, negative};
}

static void chunk_f64(const double *p, int64_t n, part_t *out) {
    vd lo, hi, s = {0}, q = {0}, ps = {0}, pq = {0}, zero = {0};
    vl z = {0}, neg = {0};
    for (int k = 0; k < WD; k++) { lo[k] = __builtin_inf(); hi[k] = -__builtin_inf(); }
    int64_t i = 0, whole = n - n % WD;
    for (; i < whole; i += WD) {
        vd v;
        memcpy(&v, p + i, sizeof v);
        vd m = pick_d(v > zero, v, zero);
        s += v;
        q += v * v;
        ps += m;
        pq += m * m;
        lo = pick_d(v < lo, v, lo);
        hi = pick_d(v > hi, v, hi);
        z -= (v == 0);
        neg -= (v < zero);
    }
    double sum = 0, sq = 0, psum = 0, psq = 0, l = __builtin_inf(), h = -__builtin_inf();
    int64_t zeros = 0, negative = 0;
    for (int k = 0; k < WD; k++) {
        sum += s[k];
        sq += q[k];
        psum += ps[k];
        psq += pq[k];
        if (lo[k] < l) l = lo[k];
        if (hi[k] > h) h = hi[k];
        zeros += z[k];
        negative += neg[k];
    }
    for (; i < n; i++) {
        double v = p[i], m = v > 0 ? v : 0.0;
        sum += v;
        sq += v * v;
        psum += m;
        psq += m * m;
        if (v < l) l = v;
        if (v > h) h = v;
        zeros += v == 0;
        negative += v < 0;
    }
    *out = (part_t){sum, sq, l, h, zeros, psum, psq, negative};
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
    *out = (part_t){(s[0] + s[1]) + (s[2] + s[3]), (q[0] + q[1]) + (q[2] + q[3]), 0, 0, 0, 0, 0, 0};
}

/* OpenMP's GOMP_parallel, taken from the runtime torch itself loaded (hs_use_openmp): the chunks
 * are then shared with torch's own worker threads, which are spinning, idle, between torch's ops.
 * Threads of our own would share a core with a spinning worker and make the whole call wait for
 * the time slice it lost (measured: 186 ms per resnet50 forward at batch 8, against 56 ms on one
 * thread and 36 ms with torch's workers). */
typedef void (*gomp_parallel_t)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
static gomp_parallel_t gomp_parallel;

void hs_use_openmp(void *fn) { gomp_parallel = (gomp_parallel_t)fn; }

/* The version of the functions' arguments and results, which hookscope._native checks before calling
 * any of them: an installed library left over from an older source is never called. Raise it with
 * any change of an hs_* signature or of what it returns (and _ABI in _native.py with it). */
#define HS_ABI 2
int hs_abi(void) { return HS_ABI; }

/* A vector stored at dst: past the cache where dst is aligned (a streaming store: the copy is read
 * back only after the optimizer's step, and the line is not read from memory first), as it is. */
#if defined(__AVX__) && HS_VBYTES == 32
#define STORE_F(dst, v, aligned) \
    do { if (aligned) _mm256_stream_ps((dst), (__m256)(v)); else memcpy((dst), &(v), sizeof(v)); } while (0)
#define FENCE(aligned) do { if (aligned) _mm_sfence(); } while (0)
#else
#define STORE_F(dst, v, aligned) memcpy((dst), &(v), sizeof(v))
#define FENCE(aligned) do { (void)(aligned); } while (0)
#endif

/* The sum of squares of a float32 src (of src - b with b), copying src into dst on the way (dst
 * NULL: no copy), as chunk_f32 sums squares: in U vector lanes over blocks of BLOCK elements, each
 * block's lanes added in float64. The copy is stored from the vectors the squares are summed from
 * (one read of src); b and dst are tested once per block, not per element. */
static void squares_f32(const float *src, const float *b, float *dst, int64_t n, part_t *out) {
    double lq[U * WF] = {0};
    int64_t i = 0, whole = n - n % (U * WF);
    int aligned = dst != NULL && (uintptr_t)dst % HS_VBYTES == 0;
    while (i < whole) {
        int64_t end = i + BLOCK < whole ? i + BLOCK : whole;
        vf q[U];
        for (int u = 0; u < U; u++) q[u] = (vf){0};
        if (dst != NULL) {
            for (; i < end; i += U * WF) {
                for (int u = 0; u < U; u++) {
                    vf v, w = {0};
                    memcpy(&v, src + i + u * WF, sizeof v);
                    STORE_F(dst + i + u * WF, v, aligned);
                    if (b != NULL) memcpy(&w, b + i + u * WF, sizeof w);
                    v -= w;
                    q[u] += v * v;
                }
            }
        }
        for (; i < end; i += U * WF) {
            for (int u = 0; u < U; u++) {
                vf v, w = {0};
                memcpy(&v, src + i + u * WF, sizeof v);
                if (b != NULL) memcpy(&w, b + i + u * WF, sizeof w);
                v -= w;
                q[u] += v * v;
            }
        }
        for (int u = 0; u < U; u++) {
            for (int k = 0; k < WF; k++) lq[u * WF + k] += q[u][k];
        }
    }
    double sq = 0;
    for (int k = 0; k < U * WF; k++) sq += lq[k];
    for (; i < n; i++) {
        if (dst != NULL) dst[i] = src[i];
        double v = (double)src[i] - (b != NULL ? (double)b[i] : 0.0);
        sq += v * v;
    }
    FENCE(aligned);  /* the streamed stores seen by whoever reads dst next */
    *out = (part_t){0, sq, 0, 0, 0, 0, 0, 0};
}

/* The same for float64, in float64 lanes. */
static void squares_f64(const double *src, const double *b, double *dst, int64_t n, part_t *out) {
    vd q[U];
    for (int u = 0; u < U; u++) q[u] = (vd){0};
    int64_t i = 0, whole = n - n % (U * WD);
    if (dst != NULL) memcpy(dst, src, (size_t)n * sizeof *src);
    for (; i < whole; i += U * WD) {
        for (int u = 0; u < U; u++) {
            vd v, w = {0};
            memcpy(&v, src + i + u * WD, sizeof v);
            if (b != NULL) memcpy(&w, b + i + u * WD, sizeof w);
            v -= w;
            q[u] += v * v;
        }
    }
    double sq = 0;
    for (int u = 0; u < U; u++) {
        for (int k = 0; k < WD; k++) sq += q[u][k];
    }
    for (; i < n; i++) {
        double v = src[i] - (b != NULL ? b[i] : 0.0);
        sq += v * v;
    }
    *out = (part_t){0, sq, 0, 0, 0, 0, 0, 0};
}

typedef struct {
    const char *p;
    int wide, centred, relu;
    double mean;
    int64_t n, chunks, next;  /* next: the next chunk to take, shared by the threads */
    part_t *parts;
    const char *b;  /* squares: the array subtracted (or NULL) */
    char *dst;      /* squares: where the array is copied (or NULL) */
    int squares;
} job_t;

static void work(void *arg) {
    job_t *j = arg;
    size_t size = j->wide ? sizeof(double) : sizeof(float);
    for (;;) {
        int64_t c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (c >= j->chunks) break;
        int64_t start = c * CHUNK, len = start + CHUNK < j->n ? CHUNK : j->n - start;
        const void *at = j->p + start * size;
        if (j->squares && j->wide)
            squares_f64(at, j->b ? (const double *)(j->b + start * size) : NULL,
                        j->dst ? (double *)(j->dst + start * size) : NULL, len, j->parts + c);
        else if (j->squares)
            squares_f32(at, j->b ? (const float *)(j->b + start * size) : NULL,
                        j->dst ? (float *)(j->dst + start * size) : NULL, len, j->parts + c);
        else if (j->centred) chunk_centred(at, j->wide, len, j->mean, j->parts + c);
        else if (j->wide) chunk_f64(at, len, j->parts + c);
        else chunk_f32(at, len, j->relu, j->parts + c);
    }
}

/* out = {sum, sum of squares, min, max, zeros, sum of max(x, 0), of its square, count of x < 0}
 * (the last three only with relu; centred: {sum of x - mean, of its square, 0, ...}). The chunks'
 * partial results are added in chunk order, so the answer does not depend on the number of threads
 * or on which thread took which chunk. Returns -1 if the partial results could not be allocated,
 * else 0. */
static int reduce(job_t *job, int threads, double *out) {
    int64_t chunks = job->chunks = (job->n + CHUNK - 1) / CHUNK;
    part_t one, *parts = chunks > 1 ? malloc((size_t)chunks * sizeof *parts) : &one;
    if (parts == NULL) return -1;
    job->parts = parts;
    if (threads > 1 && chunks > 1 && gomp_parallel != NULL) gomp_parallel(work, job, (unsigned)threads, 0);
    else work(job);
    double sum = 0, sq = 0, lo = __builtin_inf(), hi = -__builtin_inf(), psum = 0, psq = 0;
    int64_t zeros = 0, negative = 0;
    for (int64_t c = 0; c < chunks; c++) {
        sum += parts[c].sum;
        sq += parts[c].sq;
        zeros += parts[c].zeros;
        if (parts[c].lo < lo) lo = parts[c].lo;
        if (parts[c].hi > hi) hi = parts[c].hi;
        psum += parts[c].psum;
        psq += parts[c].psq;
        negative += parts[c].negative;
    }
    if (parts != &one) free(parts);
    double all[8] = {sum, sq, lo, hi, (double)zeros, psum, psq, (double)negative};
    memcpy(out, all, sizeof all);
    return 0;
}

/* With relu, out[5..7] are what ReLU's output would give as out[0], out[1] and (with out[4]) the
 * zeros: bit for bit, for finite data. */
int hs_stats(const void *p, int wide, int64_t n, int threads, int relu, double *out) {
    job_t job = {p, wide, 0, relu, 0.0, n, 0, 0, NULL, NULL, NULL, 0};
    return reduce(&job, threads, out);
}

int hs_centred(const void *p, int wide, int64_t n, double mean, int threads, double *out) {
    job_t job = {p, wide, 1, 0, mean, n, 0, 0, NULL, NULL, NULL, 0};
    return reduce(&job, threads, out);
}

/* out[1] = the sum of squares of src (copied into dst on the way, unless dst is NULL); with b (not
 * NULL), of src - b (differences in the data's precision, as torch's sub would round them): the
 * training monitor's parameter norms and update norms, one pass each. */
int hs_squares(const void *src, const void *b, void *dst, int wide, int64_t n, int threads, double *out) {
    job_t job = {src, wide, 0, 0, 0.0, n, 0, 0, NULL, b, dst, 1};
    return reduce(&job, threads, out);
}

/* Guided backpropagation through a ReLU, in one memory pass: res = grad where the ReLU's output was
 * positive and grad is not negative, else 0 -- what threshold_backward(grad, out, 0).clamp_(min=0)
 * gives, NaN included (a NaN in either passes on as those do), in one pass where those take two. */
typedef struct {
    const char *grad, *out;
    char *res;
    int wide;
    int64_t n, chunk, chunks, next;
} guided_t;

/* Both loads unconditional and the tests joined with "|": with "||" the compiler may read grad only where
 * the output is positive, a masked load that costs more than the pass (vmaskmovps on AMD). */
static void guided_f32(const float *restrict g, const float *restrict o, float *restrict r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i], oi = o[i];
        r[i] = ((oi <= 0.0f) | (gi < 0.0f)) ? 0.0f : gi;
    }
}

static void guided_f64(const double *restrict g, const double *restrict o, double *restrict r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i], oi = o[i];
        r[i] = ((oi <= 0.0) | (gi < 0.0)) ? 0.0 : gi;
    }
}

static void guided_work(void *arg) {
    guided_t *j = arg;
    size_t size = j->wide ? sizeof(double) : sizeof(float);
    for (;;) {
        int64_t c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (c >= j->chunks) break;
        int64_t start = c * j->chunk, len = start + j->chunk < j->n ? j->chunk : j->n - start;
        size_t at = (size_t)start * size;
        if (j->wide) guided_f64((const double *)(j->grad + at), (const double *)(j->out + at), (double *)(j->res + at), len);
        else guided_f32((const float *)(j->grad + at), (const float *)(j->out + at), (float *)(j->res + at), len);
    }
}

/* One contiguous slice per thread (whole cache lines): a streaming pass gains nothing from smaller
 * chunks, and each thread then reads and writes one run of pages. */
void hs_guided(const void *grad, const void *out, void *res, int wide, int64_t n, int threads) {
    if (n <= 0) return;  /* nothing to write (and no chunk to divide by) */
    int parallel = threads > 1 && n > CHUNK && gomp_parallel != NULL;
    int64_t chunk = parallel ? ((n + threads - 1) / threads + 15) / 16 * 16 : n;
    guided_t job = {grad, out, res, wide, n, chunk, (n + chunk - 1) / chunk, 0};
    if (parallel) gomp_parallel(guided_work, &job, (unsigned)threads, 0);
    else guided_work(&job);
}

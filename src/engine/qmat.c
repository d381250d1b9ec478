/* Quantised matrix products from CQ blobs: activation preparation, the
 * reference kernel and run-time kernel selection (see qmat.h). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* syscall(): AMX state permission */
#include "engine/qmat.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#include <unistd.h> /* pread */
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#endif

#include "core/fp16.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "core/tuning.h"
#include "model/cq.h"

static int stored_bits(int bits)
{
    return bits == CQ_TERNARY ? 2 : bits;
}

int nd_qmat_init(nd_qmat *m, const void *blob, size_t blob_len, int rows, int in, int bits)
{
    memset(m, 0, sizeof *m);
    if (!cq_bits_valid(bits))
        return nd_error(ND_EFORMAT, "CQ tensor has unsupported bits %d", bits);
    size_t need = cq_blob_bytes(rows, in, bits, ND_QGROUP);
    if (!need || need != blob_len)
        return nd_error(ND_EFORMAT, "CQ blob is %zu bytes, [%d, %d] at %d bits needs %zu", blob_len,
                        rows, in, bits, need);
    m->rows = rows;
    m->in = in;
    m->bits = bits;
    m->ng = (int)(cq_in_pad(in, ND_QGROUP) / ND_QGROUP);
    m->row_bytes = cq_row_bytes(in, bits, ND_QGROUP);
    m->codes = blob;
    m->norms = m->codes + m->row_bytes * (size_t)rows;
    return ND_OK;
}

nd_qmat nd_qmat_rows(const nd_qmat *m, int r0, int n)
{
    nd_qmat s = *m;
    s.rows = n;
    s.codes = m->codes + (size_t)r0 * m->row_bytes;
    s.norms = m->norms + (size_t)r0 * (size_t)m->ng * 2;
    s.file_off = m->file_off + (long long)r0 * (long long)m->row_bytes;
    return s;
}

int nd_qmat_read_rows(nd_qmat *m, int fd, long long file_off)
{
    if (fd < 0 || file_off < 0 || m->row_bytes > ND_QROW_PREAD_MAX)
        return 0;
    m->file_rows = 1;
    m->file_fd = fd;
    m->file_off = file_off;
    return 1;
}

int nd_qmat_layout(const nd_qmat *m)
{
    switch (stored_bits(m->bits)) {
    case 4: return ND_QLAYOUT_NIBBLE;
    case 2: return ND_QLAYOUT_CRUMB;
    default: return ND_QLAYOUT_NATURAL;
    }
}

size_t nd_qmat_bytes(const nd_qmat *m)
{
    return (size_t)m->rows * (m->row_bytes + (size_t)m->ng * 2);
}

int nd_qlayout_pos(int layout, int j)
{
    switch (layout) {
    case ND_QLAYOUT_NIBBLE: /* byte b holds j = 2b (low nibble), 2b + 1 */
        return (j & 1) * 64 + j / 2;
    case ND_QLAYOUT_CRUMB: /* byte b holds j = 4b + k at bits 2k */ return (j & 3) * 32 + j / 4;
    default: return j;
    }
}

float nd_qmat_norm(const nd_qmat *m, int r, int g)
{
    const uint8_t *p = m->norms + ((size_t)r * (size_t)m->ng + (size_t)g) * 2;
    return nd_half_to_float((uint16_t)(p[0] | p[1] << 8));
}

/* ---- codebooks ---- */

static pthread_once_t cb_once = PTHREAD_ONCE_INIT;
static int8_t cb_lut[6][16]; /* by record bits (2, 3, 4, CQ_TERNARY) */
static float cb_inv[6];
static float cb_float[6][16]; /* float level per stored code value */

/* cq_codebook(bits, 128) for 2, 3, 4 bits and ternary, as constants: the
 * codec derives them from 400,000 samples at a cost of 0.3 s per process
 * (test_qkernels checks they agree) */
static const float levels2[] = {-0x1.10bc8ep-3f, -0x1.46e0cp-5f, 0x1.47f812p-5f, 0x1.1153b6p-3f};
static const float levels3[] = {-0x1.839b76p-3f, -0x1.e2db6p-4f, -0x1.0ef2fap-4f, -0x1.5848d8p-6f,
                                0x1.6a1a72p-6f,  0x1.118d38p-4f, 0x1.e466c6p-4f,  0x1.84c382p-3f};
static const float levels4[] = {-0x1.ea8f84p-3f, -0x1.721604p-3f, -0x1.20ae8ep-3f, -0x1.be83f2p-4f,
                                -0x1.4de08ap-4f, -0x1.cf1314p-5f, -0x1.0dd668p-5f, -0x1.4b7c14p-7f,
                                0x1.a081ecp-7f,  0x1.2484eep-5f,  0x1.e715p-5f,    0x1.5c10dep-4f,
                                0x1.cdca28p-4f,  0x1.2856dcp-3f,  0x1.79524cp-3f,  0x1.f02d32p-3f};
static const float levels_ternary[] = {-0x1.bb233ep-4f, 0x0p+0f, 0x1.bb233ep-4f};

int nd_qlevels(int bits, const float **levels)
{
    switch (bits) {
    case 2: *levels = levels2; return 4;
    case 3: *levels = levels3; return 8;
    case 4: *levels = levels4; return 16;
    case CQ_TERNARY: *levels = levels_ternary; return 3;
    default: return 0;
    }
}

static int8_t layout_pos[3][ND_QGROUP];
#if defined(__x86_64__) || defined(__i386__)
static uint8_t layout_inv[3][ND_QGROUP]; /* natural index at each position */
static int place_vbmi;
static int row_avx512; /* nd_qmat_row's 2- and 4-bit groups in AVX-512 */
#endif

static nd_qact_group_fn select_group_fn(void);
static nd_qact_group_fn group_fn;

static void cb_compute(void)
{
    group_fn = select_group_fn();
    for (int l = 0; l < 3; l++)
        for (int j = 0; j < ND_QGROUP; j++)
            layout_pos[l][j] = (int8_t)nd_qlayout_pos(l, j);
#if defined(__x86_64__) || defined(__i386__)
    for (int l = 0; l < 3; l++)
        for (int j = 0; j < ND_QGROUP; j++)
            layout_inv[l][layout_pos[l][j]] = (uint8_t)j;
    place_vbmi = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vbmi") && !nd_tuning_get()->no_vbmi;
    row_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
#endif
    const int widths[] = {2, 3, 4, CQ_TERNARY};
    for (int w = 0; w < 4; w++) {
        int bits = widths[w], sb = stored_bits(bits);
        const float *cb;
        int n = nd_qlevels(bits, &cb);
        float mx = 0.0f;
        for (int k = 0; k < n; k++)
            mx = fabsf(cb[k]) > mx ? fabsf(cb[k]) : mx;
        for (int v = 0; v < (1 << sb); v++) {
            /* stored value -> level index, as cq_unpack_indices */
            int k = bits == CQ_TERNARY ? (v == 3 ? 0 : v + 1) : v;
            float level = k < n ? cb[k] : 0.0f;
            cb_float[bits][v] = level;
            cb_lut[bits][v] = (int8_t)lrintf(level * 127.0f / mx);
        }
        cb_inv[bits] = mx / 127.0f;
    }
}

void nd_qcodebook(int bits, int8_t lut[16], float *inv_scale)
{
    pthread_once(&cb_once, cb_compute);
    memcpy(lut, cb_lut[bits], 16);
    *inv_scale = cb_inv[bits];
}

/* stored code values of group g of a row of m (its codes at row), natural
 * order */
static void unpack_codes(const nd_qmat *m, const uint8_t *row, int g, uint8_t *v)
{
    int sb = stored_bits(m->bits);
    const uint8_t *p = row + (size_t)g * ND_QGROUP * sb / 8;
    for (int j = 0; j < ND_QGROUP; j++) {
        unsigned bit = (unsigned)(j * sb), x = p[bit >> 3] | (unsigned)p[(bit >> 3) + 1] << 8;
        if ((bit >> 3) + 1 >= (unsigned)(ND_QGROUP * sb / 8)) /* last byte: no neighbour */
            x = p[bit >> 3];
        v[j] = (uint8_t)(x >> (bit & 7) & ((1u << sb) - 1));
    }
}

void nd_qmat_unpack_values(const nd_qmat *m, int r, int g, const int8_t lut[16], int8_t *vals)
{
    uint8_t v[ND_QGROUP];
    unpack_codes(m, m->codes + (size_t)r * m->row_bytes, g, v);
    for (int j = 0; j < ND_QGROUP; j++)
        vals[j] = lut[v[j]];
}

/* in-place unnormalised Walsh-Hadamard transform of 128 (Sylvester order) */
static void fwht128(float *x)
{
    for (int h = 1; h < ND_QGROUP; h <<= 1)
        for (int i = 0; i < ND_QGROUP; i += h << 1)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void nd_qmat_row(const nd_qmat *m, int r, float *out)
{
    pthread_once(&cb_once, cb_compute);
    const float rs = (float)(1.0 / sqrt((double)ND_QGROUP));
    const uint8_t *row = m->codes + (size_t)r * m->row_bytes;
    uint8_t buf[ND_QROW_PREAD_MAX];
    if (m->file_rows && pread(m->file_fd, buf, m->row_bytes,
                              (off_t)(m->file_off + (long long)r * (long long)m->row_bytes)) ==
                            (ssize_t)m->row_bytes)
        row = buf; /* else the mapping's bytes, the same ones */
#if defined(__x86_64__) || defined(__i386__)
    const int sb = stored_bits(m->bits);
#endif
    for (int g = 0; g < m->ng; g++) {
        uint8_t v[ND_QGROUP];
        float x[ND_QGROUP], norm = nd_qmat_norm(m, r, g) * rs;
#if defined(__x86_64__) || defined(__i386__)
        if (row_avx512 && (sb == 2 || sb == 4)) {
            const uint8_t *p = row + (size_t)g * ND_QGROUP * sb / 8;
            nd_qmat_group_avx512(p, sb, cb_float[m->bits], norm, x);
            int n = m->in - g * ND_QGROUP < ND_QGROUP ? m->in - g * ND_QGROUP : ND_QGROUP;
            memcpy(out + (size_t)g * ND_QGROUP, x, (size_t)n * sizeof *x);
            continue;
        }
#endif
        unpack_codes(m, row, g, v);
        for (int j = 0; j < ND_QGROUP; j++)
            x[j] = cb_float[m->bits][v[j]] * norm;
        fwht128(x);
        int n = m->in - g * ND_QGROUP < ND_QGROUP ? m->in - g * ND_QGROUP : ND_QGROUP;
        memcpy(out + (size_t)g * ND_QGROUP, x, (size_t)n * sizeof *x);
    }
}

/* ---- activations ---- */

void nd_qact_group_ref(const float *v, int8_t *q, float *amax, int32_t *sum)
{
    float x[ND_QGROUP];
    memcpy(x, v, sizeof x);
    fwht128(x);
    float mx = 0.0f;
    for (int j = 0; j < ND_QGROUP; j++)
        mx = fabsf(x[j]) > mx ? fabsf(x[j]) : mx;
    float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < ND_QGROUP; j++) {
        float r = x[j] * inv;
        int qi = (int)(r + (r >= 0.0f ? 0.5f : -0.5f)); /* nearest, ties away */
        q[j] = (int8_t)qi;
        s += qi;
    }
    *amax = mx;
    *sum = s;
}

static nd_qact_group_fn select_group_fn(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return nd_qact_group_avx512;
#endif
    return nd_qact_group_ref;
}

/* group tg (token tg / ng, group tg % ng) of x into a */
static void prepare_group(nd_qact *a, const float *x, long tg, float rs)
{
    long t = tg / a->ng, g = tg % a->ng;
    float pad[ND_QGROUP], mx;
    int8_t natural[ND_QGROUP];
    int c0 = (int)g * ND_QGROUP, m = a->in - c0 < ND_QGROUP ? a->in - c0 : ND_QGROUP;
    const float *v = x + t * a->in + c0; /* a whole group is read in place */
    if (m < ND_QGROUP) {                 /* the last, short group: zero-padded */
        memcpy(pad, v, (size_t)m * sizeof *pad);
        for (int j = m; j < ND_QGROUP; j++)
            pad[j] = 0.0f;
        v = pad;
    }
    group_fn(v, natural, &mx, &a->sum[tg]);
    int8_t *q = a->q + tg * ND_QGROUP;
    uint8_t *qu = a->qu + tg * ND_QGROUP;
    a->scale[tg] = mx / 127.0f * rs;
#if defined(__x86_64__) || defined(__i386__)
    if (place_vbmi)
        nd_qact_place_vbmi(natural, layout_inv[a->layout], q, qu);
    else
#endif
    {
        const int8_t *pos = layout_pos[a->layout];
        for (int j = 0; j < ND_QGROUP; j++) {
            q[pos[j]] = natural[j];
            qu[pos[j]] = (uint8_t)(natural[j] + 128);
        }
    }
    if (a->tiles > 0) { /* the token's lane of its tile, while qu is in L1 */
        long tile = t / ND_QTILE, lane = t % ND_QTILE;
        uint32_t *dst = (uint32_t *)(void *)(a->qt + ((size_t)tile * (size_t)a->ng + (size_t)g) *
                                                         ND_QTILE * ND_QGROUP);
        for (int k4 = 0; k4 < ND_QGROUP / 4; k4++) {
            uint32_t v;
            memcpy(&v, qu + 4 * k4, 4);
            dst[k4 * ND_QTILE + lane] = v;
        }
        a->st[((size_t)tile * (size_t)a->ng + (size_t)g) * ND_QTILE + (size_t)lane] = a->scale[tg];
    }
}

typedef struct {
    nd_qact *a;
    const float *x;
    float rs;
} prepare_args;

static void prepare_groups(void *ctx, long lo, long hi, int tid)
{
    (void)tid;
    const prepare_args *p = ctx;
    for (long tg = lo; tg < hi; tg++)
        prepare_group(p->a, p->x, tg, p->rs);
}

/* Room for the token tiles of n tokens (see nd_qact.qt) and the lanes
 * past the last token: codes 128 (zero) and scale 0. The tokens' own
 * lanes are written as their groups are prepared. */
static int prepare_tiles(nd_qact *a, int n)
{
    int ng = a->ng, tiles = (n + ND_QTILE - 1) / ND_QTILE;
    if ((long)tiles * ng > a->cap_tiles) {
        size_t groups = (size_t)tiles * (size_t)ng;
        void *qt = realloc(a->qt, groups * ND_QTILE * ND_QGROUP);
        if (qt)
            a->qt = qt;
        void *st = realloc(a->st, groups * ND_QTILE * sizeof *a->st);
        if (st)
            a->st = st;
        if (!qt || !st)
            return nd_error(ND_ENOMEM, "out of memory preparing activation tiles");
        a->cap_tiles = (int)groups;
    }
    a->tiles = tiles;
    int tile = tiles - 1;
    for (int g = 0; g < ng; g++) {
        uint32_t *dst =
            (uint32_t *)(void *)(a->qt + ((size_t)tile * ng + g) * ND_QTILE * ND_QGROUP);
        float *st = a->st + ((size_t)tile * ng + g) * ND_QTILE;
        for (int lane = n - tile * ND_QTILE; lane < ND_QTILE; lane++) {
            for (int k4 = 0; k4 < ND_QGROUP / 4; k4++)
                dst[k4 * ND_QTILE + lane] = 0x80808080u;
            st[lane] = 0.0f;
        }
    }
    return ND_OK;
}

int nd_qact_prepare(nd_qact *a, const float *x, int n, int in, int layout)
{
    int ng = (in + ND_QGROUP - 1) / ND_QGROUP;
    if ((long)n * ng > a->cap_rows) {
        long cap = (long)n * ng;
        void *q = realloc(a->q, (size_t)cap * ND_QGROUP);
        if (q)
            a->q = q;
        void *qu = realloc(a->qu, (size_t)cap * ND_QGROUP);
        if (qu)
            a->qu = qu;
        void *s = realloc(a->scale, (size_t)cap * sizeof *a->scale);
        if (s)
            a->scale = s;
        void *u = realloc(a->sum, (size_t)cap * sizeof *a->sum);
        if (u)
            a->sum = u;
        if (!q || !qu || !s || !u)
            return nd_error(ND_ENOMEM, "out of memory preparing activations");
        a->cap_rows = (int)cap;
    }
    a->n = n;
    a->in = in;
    a->ng = ng;
    a->layout = layout;
    pthread_once(&cb_once, cb_compute);
    const float rs = (float)(1.0 / sqrt((double)ND_QGROUP));
    long groups = (long)n * ng;
    a->tiles = 0;
    int rc = n >= ND_QTILE_MIN ? prepare_tiles(a, n) : ND_OK;
    if (rc)
        return rc;
    if (groups < 128) { /* a few groups (~70 ns each): no thread team */
        for (long tg = 0; tg < groups; tg++)
            prepare_group(a, x, tg, rs);
    } else {
        prepare_args pa = {a, x, rs};
        nd_parallel_for(groups, 32, prepare_groups, &pa);
    }
    return ND_OK;
}

void nd_qact_free(nd_qact *a)
{
    free(a->q);
    free(a->qu);
    free(a->scale);
    free(a->sum);
    free(a->qt);
    free(a->st);
    memset(a, 0, sizeof *a);
}

/* ---- reference kernel ---- */

void nd_qgemm_ref(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy)
{
    int8_t lut[16], vals[ND_QGROUP];
    float inv;
    nd_qcodebook(w->bits, lut, &inv);
    for (int r = r0; r < r1; r++)
        for (int t = 0; t < x->n; t++) {
            float acc = 0.0f;
            for (int g = 0; g < w->ng; g++) {
                nd_qmat_unpack_values(w, r, g, lut, vals);
                const int8_t *q = x->q + ((size_t)t * x->ng + (size_t)g) * ND_QGROUP;
                int32_t isum = 0;
                for (int j = 0; j < ND_QGROUP; j++)
                    isum += vals[j] * q[nd_qlayout_pos(x->layout, j)];
                acc +=
                    nd_qmat_norm(w, r, g) * x->scale[(size_t)t * x->ng + (size_t)g] * (float)isum;
            }
            y[(size_t)t * ldy + (size_t)r] = acc * inv;
        }
}

/* ---- selection ---- */

static nd_qkernel kernels[8];
static int n_kernels;
static const nd_qkernel *best_kernel;
static pthread_once_t sel_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
/* AMX int8 tiles: the CPU has them and Linux lets this process use their
 * state (ARCH_REQ_XCOMP_PERM for XTILEDATA, Linux 5.16+; process-wide).
 * Returns AMX_INT8 | AMX_BF16 bits (BF16 tiles only with the int8 ones). */
enum { AMX_INT8 = 1, AMX_BF16 = 2 };
static int amx_request(void)
{
#if defined(__x86_64__) && defined(__linux__) && defined(SYS_arch_prctl)
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
    if (!amx_tile || !amx_int8 || !__builtin_cpu_supports("avx512vnni"))
        return 0;
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0)
        return 0;
    return AMX_INT8 | (amx_bf16 ? AMX_BF16 : 0);
#else
    return 0;
#endif
}

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_bits;

static void amx_check(void)
{
    amx_bits = amx_request();
}

static int amx_usable(void)
{
    pthread_once(&amx_once, amx_check);
    return amx_bits & AMX_INT8;
}

int nd_amx_usable(void)
{
    return amx_usable();
}

int nd_amx_bf16_usable(void)
{
    pthread_once(&amx_once, amx_check);
    return (amx_bits & AMX_BF16) != 0;
}
#else
int nd_amx_usable(void)
{
    return 0;
}

int nd_amx_bf16_usable(void)
{
    return 0;
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* AVX-VNNI (VEX-encoded 256-bit vpdpbusd): CPUID leaf 7 subleaf 1, EAX
 * bit 4 (asked directly: not every compiler's __builtin_cpu_supports
 * knows the name); the caller has checked AVX2 (and so the OS's YMM state) */
static int cpu_avxvnni(void)
{
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7)
        return 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    return (a >> 4) & 1;
}
#endif

static void select_kernels(void)
{
    pthread_once(&cb_once, cb_compute);
    kernels[n_kernels++] = (nd_qkernel){"ref", nd_qgemm_ref, 0};
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        kernels[n_kernels++] = (nd_qkernel){"avx2", nd_qgemm_avx2, 0};
        if (cpu_avxvnni())
            kernels[n_kernels++] = (nd_qkernel){"avxvnni", nd_qgemm_avxvnni, 1};
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
        kernels[n_kernels++] = (nd_qkernel){"avx512", nd_qgemm_avx512, 0};
        if (__builtin_cpu_supports("avx512vnni")) {
            kernels[n_kernels++] = (nd_qkernel){"avx512vnni", nd_qgemm_avx512vnni, 1};
            if (amx_usable())
                kernels[n_kernels++] = (nd_qkernel){"amx", nd_qgemm_amx, 1};
        }
    }
#endif
#if defined(__aarch64__)
    kernels[n_kernels++] = (nd_qkernel){"neon", nd_qgemm_neon, 0};
    /* Linux says which extensions user space may run */
#if defined(__linux__) && defined(ND_QNEON_DOT)
    if (getauxval(AT_HWCAP) & (1ul << 20)) /* HWCAP_ASIMDDP */
        kernels[n_kernels++] = (nd_qkernel){"neondot", nd_qgemm_neondot, 0};
#endif
#if defined(__linux__) && defined(ND_QNEON_I8MM)
    if (getauxval(AT_HWCAP2) & (1ul << 13)) /* HWCAP2_I8MM */
        kernels[n_kernels++] = (nd_qkernel){"neoni8mm", nd_qgemm_neoni8mm, 0};
#endif
#endif
    best_kernel = &kernels[n_kernels - 1];
    const char *want = nd_tuning_get()->qkernel;
    for (int i = 0; want && i < n_kernels; i++)
        if (!strcmp(kernels[i].name, want))
            best_kernel = &kernels[i];
}

int nd_qkernel_count(void)
{
    pthread_once(&sel_once, select_kernels);
    return n_kernels;
}

const nd_qkernel *nd_qkernel_get(int i)
{
    pthread_once(&sel_once, select_kernels);
    return i >= 0 && i < n_kernels ? &kernels[i] : NULL;
}

const nd_qkernel *nd_qkernel_best(void)
{
    pthread_once(&sel_once, select_kernels);
    return best_kernel;
}

/* tokens [t0, t0 + n) of x */
static nd_qact token_view(const nd_qact *x, int t0, int n)
{
    nd_qact v = *x;
    size_t off = (size_t)t0 * (size_t)x->ng;
    v.n = n;
    v.q += off * ND_QGROUP;
    v.qu += off * ND_QGROUP;
    v.scale += off;
    v.sum += off;
    v.tiles = 0; /* tiles start at token 0 of x */
    return v;
}

nd_qact nd_qact_tile_view(const nd_qact *x, int ta, int nt)
{
    int t0 = ta * ND_QTILE, n = x->n - t0 < nt * ND_QTILE ? x->n - t0 : nt * ND_QTILE;
    nd_qact v = token_view(x, t0, n);
    v.tiles = nt;
    v.qt = x->qt + (size_t)ta * (size_t)x->ng * ND_QTILE * ND_QGROUP;
    v.st = x->st + (size_t)ta * (size_t)x->ng * ND_QTILE;
    return v;
}

/* A prompt chunk's products split by tokens, not by rows: thread p takes
 * tiles [p * per, (p + 1) * per) of every matrix. The row-wise operations
 * around the products split the chunk's rows the same way (nd_parallel_for
 * gives thread p the p-th share), so a token's activations stay in the
 * cache of the core that made them; split by rows, every product's output
 * rows were half in the other core's cache for the next operation. Each
 * thread unpacks every weight row (the weights are shared read-only). Only
 * where each thread gets an even count of tiles; the same kernel calls per
 * output value either way, so the results are identical. */
static int token_parts(const nd_qkernel *k, const nd_qact *x)
{
    int team = nd_get_threads();
    /* an even count of tiles a part: the tile kernels run tiles in pairs
     * (an odd last one twice), so one tile a part would double the work */
    if (team < 2 || !k->tiles || x->tiles < 2 * team || x->tiles % (2 * team) || nd_serial())
        return 0;
    return team;
}

/* products of one prepared batch with several matrices (count <= 8) */
typedef struct {
    nd_qgemm_fn fn;
    const nd_qmat *const *w;
    const nd_qact *x;
    float *const *y;
    const int *ldy;
    long first[9]; /* split by rows: the task index where matrix i starts */
    int count;
    int per;       /* split by tokens: tiles a task */
    int task_rows; /* split by rows: rows a task */
} qgemm_many_args;

static void tile_part_tasks(void *ctx, long lo, long hi, int tid)
{
    (void)tid;
    const qgemm_many_args *a = ctx;
    for (long p = lo; p < hi; p++) {
        int ta = (int)p * a->per;
        nd_qact v = nd_qact_tile_view(a->x, ta, a->per);
        for (int i = 0; i < a->count; i++)
            a->fn(a->w[i], &v, 0, a->w[i]->rows, a->y[i] + (size_t)ta * ND_QTILE * a->ldy[i],
                  a->ldy[i]);
    }
}

static void qgemm_by_tokens(nd_qgemm_fn fn, const nd_qmat *const w[], int count, const nd_qact *x,
                            float *const y[], const int ldy[], int parts)
{
    qgemm_many_args a = {.fn = fn, .w = w, .x = x, .y = y, .ldy = ldy, .count = count};
    a.per = x->tiles / parts;
    nd_parallel_for(parts, 1, tile_part_tasks, &a);
}

typedef struct {
    nd_qgemm_fn fn;
    const nd_qmat *w;
    const nd_qact *x;
    float *y;
    int ldy, tb, r_blocks;
} qgemm_args;

/* tasks: (token block, block of 16 rows) */
static void qgemm_tasks(void *ctx, long lo, long hi, int tid)
{
    (void)tid;
    const qgemm_args *g = ctx;
    for (long task = lo; task < hi; task++) {
        int b = (int)(task / g->r_blocks), rb = (int)(task % g->r_blocks);
        int t0 = b * g->tb, n = g->x->n - t0 < g->tb ? g->x->n - t0 : g->tb;
        int r0 = rb * 16, r1 = r0 + 16 < g->w->rows ? r0 + 16 : g->w->rows;
        nd_qact v = token_view(g->x, t0, n);
        g->fn(g->w, &v, r0, r1, g->y + (size_t)t0 * g->ldy, g->ldy);
    }
}

/* tasks: blocks of 48 rows, every token (kernels on token tiles) */
static void qgemm_row_tasks(void *ctx, long lo, long hi, int tid)
{
    (void)tid;
    const qgemm_args *g = ctx;
    for (long task = lo; task < hi; task++) {
        int r0 = (int)task * 48, r1 = r0 + 48 < g->w->rows ? r0 + 48 : g->w->rows;
        g->fn(g->w, g->x, r0, r1, g->y, g->ldy);
    }
}

/* Products under this many multiply-adds stay on the calling thread: a
 * fork costs more than it saves (both nd_qgemm and nd_qgemm_many). */
#define QGEMM_SPLIT_MACS (1L << 17)

void nd_qgemm(const nd_qmat *w, const nd_qact *x, float *y, int ldy)
{
    const nd_qkernel *k = nd_qkernel_best();
    nd_qgemm_fn fn = k->gemm;
    long work = (long)w->rows * w->in * x->n;
    int serial = nd_get_threads() < 2 || work < QGEMM_SPLIT_MACS || w->rows < 64;
    int parts = work < QGEMM_SPLIT_MACS ? 0 : token_parts(k, x);
    if (parts) {
        float *const ys[1] = {y};
        const int lds[1] = {ldy};
        qgemm_by_tokens(fn, &w, 1, x, ys, lds, parts);
        return;
    }
    if (k->tiles && x->tiles > 0) {
        if (serial) {
            fn(w, x, 0, w->rows, y, ldy);
            return;
        }
        qgemm_args ga = {fn, w, x, y, ldy, 0, 0};
        nd_parallel_for_guided((w->rows + 47) / 48, 1, qgemm_row_tasks, &ga);
        return;
    }
    /* token blocks whose int8 activations stay in L1 (32 KB) while every
     * row of the block streams past; row blocks of 16 split over threads */
    int tb = 32768 / (x->ng * ND_QGROUP);
    tb = tb < 4 ? 4 : tb / 4 * 4;
    int t_blocks = (x->n + tb - 1) / tb, r_blocks = (w->rows + 15) / 16;
    if (serial) {
        for (int b = 0; b < t_blocks; b++) {
            int t0 = b * tb, n = x->n - t0 < tb ? x->n - t0 : tb;
            nd_qact v = token_view(x, t0, n);
            fn(w, &v, 0, w->rows, y + (size_t)t0 * ldy, ldy);
        }
        return;
    }
    /* dynamic: a thread that the OS has parked (shared cores) must not
     * hold up its share of the rows */
    qgemm_args ga = {fn, w, x, y, ldy, tb, r_blocks};
    nd_parallel_for_guided((long)t_blocks * r_blocks, 1, qgemm_tasks, &ga);
}

#define MANY_ROWS 48 /* whole row blocks of the tile kernels (6 and 16) */
/* One token (a decode step): the matrix-vector kernels take any rows, and
 * smaller tasks shorten the wait for a helper's last one (the step makes
 * ~80 such calls; at 48 rows the caller waited ~7% of a two-thread step) */
#define MANY_ROWS_ONE 16

static void qgemm_many_tasks(void *ctx, long lo, long hi, int tid)
{
    (void)tid;
    const qgemm_many_args *g = ctx;
    for (long task = lo; task < hi; task++) {
        int i = 0;
        while (task >= g->first[i + 1])
            i++;
        int r0 = (int)(task - g->first[i]) * g->task_rows;
        int r1 = r0 + g->task_rows < g->w[i]->rows ? r0 + g->task_rows : g->w[i]->rows;
        g->fn(g->w[i], g->x, r0, r1, g->y[i], g->ldy[i]);
    }
}

void nd_qgemm_many(const nd_qmat *const w[], int count, const nd_qact *x, float *const y[],
                   const int ldy[])
{
    const nd_qkernel *k = nd_qkernel_best();
    long work = 0;
    for (int i = 0; i < count; i++)
        work += (long)w[i]->rows * w[i]->in * x->n;
    /* only a batch the kernel takes whole (one token, or token tiles) can
     * be split by rows alone; else one call per matrix */
    if (count > 8 || nd_get_threads() < 2 || work < QGEMM_SPLIT_MACS ||
        (x->n > 1 && !(k->tiles && x->tiles > 0))) {
        for (int i = 0; i < count; i++)
            nd_qgemm(w[i], x, y[i], ldy[i]);
        return;
    }
    int parts = token_parts(k, x);
    if (parts) {
        qgemm_by_tokens(k->gemm, w, count, x, y, ldy, parts);
        return;
    }
    qgemm_many_args a = {.fn = k->gemm, .w = w, .x = x, .y = y, .ldy = ldy, .count = count};
    a.task_rows = x->n == 1 ? MANY_ROWS_ONE : MANY_ROWS;
    for (int i = 0; i < count; i++)
        a.first[i + 1] = a.first[i] + (w[i]->rows + a.task_rows - 1) / a.task_rows;
    for (int i = count + 1; i < 9; i++)
        a.first[i] = a.first[count];
    nd_parallel_for_guided(a.first[count], 1, qgemm_many_tasks, &a);
}

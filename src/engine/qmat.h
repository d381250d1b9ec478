/* Quantised matrix products straight from CQ blobs (model/cq.h), without a
 * float copy of the weights.
 *
 * A CQ row group is w = norm * (c @ H) with c the codebook values and H the
 * normalised Walsh matrix (symmetric), so w . x = norm * (c . (H x)): each
 * activation group of 128 is rotated once (fast Walsh-Hadamard) and
 * quantised to int8 with one scale per group (upstream's A8). The codebook
 * levels become int8 too (scaled so the largest is 127), and every kernel
 * computes the exact integer sum of code value * activation per group,
 * then y = sum_g norm_g * scale_g * isum_g / codebook_scale in float.
 *
 * The int8 activations of a group are stored permuted to match how the
 * packed codes unpack in SIMD registers (nibble / crumb planes), so the
 * kernels never shuffle activations; the reference reads the same layout.
 *
 * Kernels: a plain C reference (the ground truth) and AVX2, AVX-VNNI
 * (256-bit), AVX-512 (VNNI), AMX and NEON (dot product, i8mm) variants
 * selected at run time; see nd_qkernel_*. */
#ifndef ND_QMAT_H
#define ND_QMAT_H

#include <stddef.h>
#include <stdint.h>

#define ND_QGROUP 128

/* A CQ matrix [rows, in] whose blob lives elsewhere (mapped archive). */
typedef struct {
    const uint8_t *codes;   /* rows * row_bytes packed indices */
    const uint8_t *norms;   /* rows * ng FP16 norms, little-endian */
    int rows, in, ng, bits; /* bits: 2, 3, 4 or CQ_TERNARY */
    size_t row_bytes;
    /* file_rows: nd_qmat_row reads a row's codes with pread from file_fd
     * at file_off + r * row_bytes (the same bytes as codes), so a lookup
     * table read a row at a time never maps its pages: a mapped read
     * maps the 64 KB around it (Linux's fault-around), and scattered
     * lookups soon make the whole table resident (nd_qmat_read_rows) */
    int file_rows, file_fd;
    long long file_off;
} nd_qmat;

/* Activation layouts (how a group's 128 int8 values are ordered). */
enum { ND_QLAYOUT_NATURAL, ND_QLAYOUT_NIBBLE, ND_QLAYOUT_CRUMB };

/* n rows of rotated, int8-quantised activations. */
typedef struct {
    int n, in, ng, layout, cap_rows;
    int8_t *q;    /* [n][ng][128] */
    uint8_t *qu;  /* q + 128 as unsigned bytes (VNNI's unsigned operand) */
    float *scale; /* [n][ng]: x_rot ~= scale * q */
    int32_t *sum; /* [n][ng]: sum of q (offset correction of u8 x s8 dots) */
    /* Batches of at least ND_QTILE_MIN tokens also get the unsigned bytes
     * in tiles of 16 tokens, for kernels that put tokens in vector lanes:
     * qt[tile][g][k4][16 tokens][4 bytes] = qu[tile * 16 + lane][g][4 k4 ..]
     * and st[tile][g][16] = scale; tokens past n read as zero (qt 128,
     * st 0). NULL for smaller batches. */
    uint8_t *qt;
    float *st;
    int tiles, cap_tiles; /* cap_tiles: tile groups (tiles x ng) allocated */
} nd_qact;

#define ND_QTILE 16
#define ND_QTILE_MIN 16

/* A kernel variant: y[t * ldy + r] for rows [r0, r1) and every token t of
 * x. x must be prepared in nd_qmat_layout(w). */
typedef void (*nd_qgemm_fn)(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);

typedef struct {
    const char *name;
    nd_qgemm_fn gemm;
    int tiles; /* uses x->qt when present: give it every token at once */
} nd_qkernel;

/* Describe a CQ blob of `rows` x `in` at `bits` (group 128). Returns ND_OK
 * or ND_EFORMAT when blob_len does not match. */
int nd_qmat_init(nd_qmat *m, const void *blob, size_t blob_len, int rows, int in, int bits);
/* Rows [r0, r0 + n) of m as a matrix of their own. */
nd_qmat nd_qmat_rows(const nd_qmat *m, int r0, int n);
/* The activation layout the kernels expect for m's width. */
int nd_qmat_layout(const nd_qmat *m);
/* Bytes of blob a full product with m reads (codes + norms). */
size_t nd_qmat_bytes(const nd_qmat *m);
/* Dequantise row r into out[in] (float, same values as cq_dequantize up to
 * float rounding of the rotation). */
void nd_qmat_row(const nd_qmat *m, int r, float *out);
/* Let nd_qmat_row read m's codes from file descriptor fd, whose byte
 * file_off holds m->codes[0] (the descriptor stays the caller's; a read
 * that fails falls back to the mapping). Rows wider than
 * ND_QROW_PREAD_MAX code bytes keep the mapped read. Returns whether the
 * file is used. */
#define ND_QROW_PREAD_MAX 2048
int nd_qmat_read_rows(nd_qmat *m, int fd, long long file_off);

/* Token tiles [ta, ta + nt) of a prepared batch with tiles, as a batch of
 * their own (no copy): a tile kernel gives their tokens the same values
 * as on the whole batch. */
nd_qact nd_qact_tile_view(const nd_qact *x, int ta, int nt);
/* Prepare n rows of x ([n, in], row stride in) for matrices of `layout`. */
int nd_qact_prepare(nd_qact *a, const float *x, int n, int in, int layout);
void nd_qact_free(nd_qact *a);

/* The int8 codebook of a width: lut[v] for every stored code value v
 * (2^stored_bits entries; ternary crumbs map 3, 0, 1 -> -c, 0, +c) and the
 * factor that turns integer sums back into codebook units. */
void nd_qcodebook(int bits, int8_t lut[16], float *inv_scale);

/* The float codebook levels of a width (cq_codebook(bits, 128) as
 * constants); returns the level count, 0 for an unknown width. */
int nd_qlevels(int bits, const float **levels);

/* Kernel variants: the reference and whichever SIMD ones this build and
 * CPU support (index 0 is the reference). */
int nd_qkernel_count(void);
const nd_qkernel *nd_qkernel_get(int i);
/* Whether this CPU has AMX int8 tiles and Linux lets the process use them
 * (asked once; the attention uses them too). */
int nd_amx_usable(void);
/* ... and its BF16 tiles too (tdpbf16ps; the prefill attention kernel) */
int nd_amx_bf16_usable(void);
/* The fastest supported variant ($NEEDLE_QKERNEL=name picks one). */
const nd_qkernel *nd_qkernel_best(void);

/* y[t * ldy + r] = sum_k w[r, k] * x[t, k] with the best kernel, rows split
 * over OpenMP threads when the product is large enough. */
void nd_qgemm(const nd_qmat *w, const nd_qact *x, float *y, int ldy);
/* nd_qgemm for `count` (<= 8) matrices of the same input width on one x,
 * in one parallel region: y[i][t * ldy[i] + r] = w[i] x[t] (a decode step's
 * q, k, v and gate projections cost one fork instead of four). */
void nd_qgemm_many(const nd_qmat *const w[], int count, const nd_qact *x, float *const y[],
                   const int ldy[]);

/* ---- internals shared by the kernel files ---- */

/* FP16 norm g of row r. */
float nd_qmat_norm(const nd_qmat *m, int r, int g);
/* Unpack group g of row r into int8 codebook values in the NATURAL order. */
void nd_qmat_unpack_values(const nd_qmat *m, int r, int g, const int8_t lut[16], int8_t *vals);
/* Position of natural index j inside a group stored in `layout`. */
int nd_qlayout_pos(int layout, int j);

/* One activation group (128 floats, zero-padded): Walsh-Hadamard transform
 * (unnormalised), max |.|, int8 at 127 / max in the NATURAL order, sum. */
typedef void (*nd_qact_group_fn)(const float *v, int8_t *q, float *amax, int32_t *sum);
void nd_qact_group_ref(const float *v, int8_t *q, float *amax, int32_t *sum);

void nd_qgemm_ref(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
#if defined(__x86_64__) || defined(__i386__)
void nd_qgemm_avx2(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
void nd_qgemm_avxvnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
void nd_qgemm_avx512(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
void nd_qgemm_avx512vnni(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
void nd_qgemm_amx(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
void nd_qact_group_avx512(const float *v, int8_t *q, float *amax, int32_t *sum);
/* group g of a row with 2- or 4-bit stored codes as floats: levels[v] *
 * norm for each stored value v, Walsh-Hadamard transformed (the scalar
 * nd_qmat_row's values bit for bit) */
void nd_qmat_group_avx512(const uint8_t *codes, int sb, const float levels[16], float norm,
                          float *out);
void nd_qact_place_vbmi(const int8_t *natural, const uint8_t inv[ND_QGROUP], int8_t *q,
                        uint8_t *qu);
#endif
#if defined(__aarch64__)
void nd_qgemm_neon(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
/* The sdot and smmla kernels: gcc compiles them into any build (a target
 * attribute per function); clang's arm_neon.h (14) offers their intrinsics
 * only when the whole build targets the extension (-march=...+dotprod). */
#if !defined(__clang__) || defined(__ARM_FEATURE_DOTPROD)
#define ND_QNEON_DOT 1
void nd_qgemm_neondot(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
#endif
#if !defined(__clang__) || defined(__ARM_FEATURE_MATMUL_INT8)
#define ND_QNEON_I8MM 1
void nd_qgemm_neoni8mm(const nd_qmat *w, const nd_qact *x, int r0, int r1, float *y, int ldy);
#endif
#endif

#endif

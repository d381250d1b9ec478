/* Cached attention over the int8 KV cache: the block task both kernels
 * share (attention.c's reference and attention_x86.c's AVX-512 one) and the
 * choice between them. */
#ifndef ND_ATTENTION_H
#define ND_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* Query rows per attention task (nr <= ND_ATT_ROWS): one int8 -> float
 * conversion of a cached key serves them all. The score scratch
 * (nd_kv_state.att_s) holds ND_ATT_ROWS * rep rows of max_len per thread. */
#define ND_ATT_ROWS 8

/* One task: nr consecutive query rows (positions pos0..pos0+nr-1) of the
 * rep query heads that share kv head g. */
typedef struct {
    const float *q; /* row 0's first head of the group; row stride qd */
    float *out;     /* same layout as q */
    int qd;
    const int8_t *k8, *v8; /* kv head g's rows of the layer; row stride `stride` */
    const float *ks, *vs;  /* row j's scales at ks[j * G] (offset to g) */
    int stride, G, hd, rep, nr;
    int pos0;
    const int *se, *j0; /* per row: keys [0, se) and [j0, pos] are seen */
    float scale;        /* 1/sqrt(hd) */
    float *scores;      /* nr * rep rows of ml floats */
    size_t ml;
} nd_att_block;

/* ND_ATT_AMX: the AVX-512 kernel whose tasks of at least ND_ATT_AMX_MIN
 * query rows (prefill) take their scores from AMX int8 tiles.
 * ND_ATT_VNNI512, ND_ATT_AVXVNNI, ND_ATT_AVX2I8: the scores as integer dot
 * products of the query rows quantised to int8 (nd_att_quant_q) with the
 * int8 keys (AVX-512 VNNI, 256-bit AVX-VNNI, AVX2 vpmaddubsw); softmax and
 * the weighted V rows in float. */
enum {
    ND_ATT_REF = 0,
    ND_ATT_AVX512 = 1,
    ND_ATT_AMX = 2,
    ND_ATT_VNNI512 = 3,
    ND_ATT_AVXVNNI = 4,
    ND_ATT_AVX2I8 = 5,
    ND_ATT_KERNELS = 6
};
#define ND_ATT_AMX_MIN 8

/* The kernel cached attention uses: the fastest the CPU runs, unless
 * NEEDLE_ATT=ref|avx512|amx|avx512vnni|avxvnni|avx2 names one it runs
 * (read once). */
int nd_att_kernel(void);
/* the kernel's NEEDLE_ATT word ("ref", "avx512", "amx", "avx512vnni",
 * "avxvnni", "avx2") */
const char *nd_att_kernel_name(int kernel);
/* Whether this CPU runs the AVX-512 kernel at all. */
int nd_att_avx512_supported(void);
/* Whether this CPU runs kernel k (any ND_ATT_*; the reference always). */
int nd_att_supported(int k);
/* the CPU checks behind it (attention_x86.c, attention_i8_x86.c) */
int nd_att_vnni512_supported(void);
int nd_att_avxvnni_supported(void);
int nd_att_avx2i8_supported(void);
/* A query row as int8: qi[e] = round(q[e] / s), s = max|q| / 127 (a zero
 * row: all zero, s = 0); returns s, and the sum of qi in *sum. hd is a
 * multiple of 4. */
float nd_att_quant_q(const float *q, int hd, int8_t *qi, int32_t *sum);
/* The integer-score kernels take hd a multiple of 16 (<= ND_ATT_MAX_HD). */
void nd_att_block_vnni512(const nd_att_block *b);
void nd_att_block_avxvnni(const nd_att_block *b);
void nd_att_block_avx2i8(const nd_att_block *b);
/* The AVX-512 kernel takes hd a multiple of 16 (<= ND_ATT_MAX_HD). */
void nd_att_block_avx512(const nd_att_block *b);
/* The same with the scores from AMX tiles where hd is a multiple of 64
 * (the query rows quantised to int8; the float path otherwise). Needs
 * nd_amx_usable(). */
void nd_att_block_amx(const nd_att_block *b);

/* Attention of n new query rows (positions p0..p0+n-1) of layer l with
 * kernel `kernel` (ND_ATT_AVX512 falls back to the reference where it does
 * not apply): out [n, q_dim] from the rotated q [n, q_dim] and the cache's
 * keys 0..p (or the last kv_window of them, and the sinks). */
void nd_kv_attention(const nd_kv_state *s, int l, int p0, int n, const float *q, float *out,
                     int kernel);

/* ---- Needle 3 ----
 * One task: nr consecutive query rows (positions pos0..) of the rep query
 * heads sharing kv head g; separate q/k (hd) and v (vhd) head dims; the
 * cache's rows float (kf, vf) or int8 (k8, v8 with per (row, kv head)
 * scales ks, vs). Row j of the cache is position j, or (below) a ring's
 * row for a cache kept as a ring of `ring` rows (0: none). */
typedef struct {
    const float *q; /* row 0's head g * rep; rows qd apart, heads hd apart */
    float *out;     /* row 0's head g * rep; rows od apart, heads vhd apart */
    int qd, od;
    const float *kf, *vf;    /* float rows (else NULL), offset to head g */
    const int8_t *k8, *v8;   /* int8 rows (else NULL), offset to head g */
    const float *ks, *vs;    /* int8 rows' scales: row j's at ks[j * G] (offset to g) */
    size_t kstride, vstride; /* elements from one cache row to the next */
    int G, hd, vhd, rep, nr, ring;
    int pos0;
    const int *se, *j0; /* per query row: keys [0, se) and [j0, pos] are seen */
    float scale;        /* 1/sqrt(hd) */
    float *scores;      /* nr * rep rows of ml floats */
    size_t ml;
    /* with a ring: positions below ring_base are rows in place, position
     * j >= ring_base is row ring_base + (j + ring_shift) % ring */
    int ring_base, ring_shift;
} nd_att3_block;

static inline int nd_att3_row(const nd_att3_block *b, int j)
{
    return b->ring && j >= b->ring_base ? b->ring_base + (j + b->ring_shift) % b->ring : j;
}

/* a cache slot's ring (a local layer's, kv.c) into the task */
static inline void nd_kv_att3_ring(const nd_kv_state *s, int slot, nd_att3_block *b)
{
    if (!s->lr_ring || !s->kv_local[slot])
        return;
    b->ring = s->lr_ring;
    b->ring_base = s->lr_base;
    long sh = (s->evicted - s->lr_base) % s->lr_ring;
    b->ring_shift = (int)(sh < 0 ? sh + s->lr_ring : sh);
}

enum { ND_ATT3_REF = 0, ND_ATT3_AVX2 = 1, ND_ATT3_AVX512 = 2 };
/* the SIMD kernels' limits: head dims up to ND_ATT3_MAX_HD, and one
 * query row's rep heads (padded) within ND_ATT3_BUF floats */
#define ND_ATT3_MAX_HD 256
#define ND_ATT3_BUF 6144

/* The v3 kernel: the fastest this CPU runs (AVX-512, else AVX2, else the
 * reference), or NEEDLE_ATT=ref / avx2 / avx512 where the CPU has it (read
 * once). */
int nd_att3_kernel(void);
/* whether the CPU runs kernel k (ND_ATT3_REF always) */
int nd_att3_supported(int k);
/* whether the SIMD kernels take these dims (else the reference runs) */
int nd_att3_simd_fits(int hd, int vhd, int rep);
void nd_att3_block_ref(const nd_att3_block *b);
void nd_att3_block_avx2(const nd_att3_block *b);
void nd_att3_block_avx512(const nd_att3_block *b);

/* Needle 3 (float or int8 rows, separate q/k and v head dims): out [n, o_dim]
 * from the rotated q [n, q_dim] of layer l over its cache slot's keys; a
 * local layer (window > 0) sees the last `window` positions only (no
 * sinks), a global one the keys nd_kv_attention's would. kernel: ND_ATT3_*
 * (one the CPU or the dims do not take runs as the reference). */
void nd_kv_attention3(const nd_kv_state *s, int l, int p0, int n, const float *q, float *out,
                      int window, int kernel);

#endif

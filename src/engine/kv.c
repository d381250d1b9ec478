/* The KV cache's storage (upstream decode.py's cache): per layer the K/V
 * rows of every position, per engram site the v' rows, the token history;
 * allocation, growth, the sliding window, snapshots, the int8 formats.
 * The incremental forward that fills and reads it is forward.c, the cached
 * attention attention.c. */
#define _DEFAULT_SOURCE /* madvise */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/mem.h"
#include "core/status.h"
#include "core/threadpool.h"
#include "engine/attention.h"
#include "engine/engine.h"
#include "engine/kv_internal.h"
#include "model/hada3.h"
#include "model/san.h"

int nd_kv_max_order(const san_model *m)
{
    int mo = 1;
    for (int i = 0; i < m->cfg.n_orders; i++)
        if (m->cfg.engram_orders[i] > mo)
            mo = m->cfg.engram_orders[i];
    return mo;
}

/* Needle 2's layer values in the slots of nx's rows (N rows each), each
 * written after its last user read it (model/block.c's order) */
static void share_layer_rows(nd_kv_state *s, size_t N)
{
    const san_dims *D = &s->m->dims;
    san_layer_acts *A = &s->la;
    size_t d = (size_t)D->d;
    float *a = A->nx, *q = a + N * d, *k = q + N * (size_t)D->q_dim, *v = k + N * (size_t)D->k_dim,
          *g = v + N * (size_t)D->v_dim;
    A->a = a; /* the attention input: dead once q, k, v, g are made */
    A->q = q;
    A->k = k;
    A->v = v;
    A->g = g;
    A->att = a; /* then the attention output, */
    A->o = q;   /* gated (q is rotated and attended by then), */
    A->o2 = k;  /* projected (over k and v), */
    A->pn = a;  /* normalised, */
    A->x1 = g;  /* added to the block input (g gated o by then), */
    A->z = q;   /* the MLP's norm (o projected by then) */
    A->y = k;   /* and the MLP's output (o2 normalised by then) */
    s->xm = a;  /* between layers and after the last: the lane mean */
    s->hf = q;
}

/* the conv ring of `ring` rows per layer and the pinned prefix's rows */
static int conv_alloc(nd_kv_state *s, int ring)
{
    const san_dims *D = &s->m->dims;
    size_t cw = (size_t)D->q_dim + D->k_dim + D->v_dim, L = (size_t)D->L;
    size_t back = (size_t)s->m->cfg.qkv_conv_taps - 1;
    free(s->cv);
    free(s->cv_pin);
    s->cv = calloc(L * (size_t)ring * cw + 1, sizeof(float));
    s->cv_pin = calloc(L * back * cw + 1, sizeof(float));
    s->cv_ring = ring;
    s->cv_hw = 0;
    s->cv_lo = 0;
    return s->cv && s->cv_pin ? ND_OK : ND_ENOMEM;
}

/* One buffer of the decoder's scratch block: where its pointer lives, its
 * size. */
typedef struct {
    void **p;
    size_t bytes;
} kv_plan_e;

/* The scratch block: one allocation, each planned buffer at a 64-byte
 * boundary in plan order; the first n_keep are the ones kept for the
 * state's life (nd_kv_release_scratch leaves them be). */
static int kv_carve_scratch(nd_kv_state *s, const kv_plan_e *plan, int np, int n_keep)
{
    size_t total = 0;
    for (int i = 0; i < np; i++)
        total += (plan[i].bytes + 63) & ~(size_t)63;
    char *blk = calloc(1, total);
    if (!blk)
        return nd_error(ND_ENOMEM, "out of memory: decoder scratch needs %.1f MB",
                        (double)total / 1e6);
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        *plan[i].p = blk + off;
        off += (plan[i].bytes + 63) & ~(size_t)63;
    }
    s->scratch = blk;
    s->scratch_bytes = total;
    s->scratch_mapped = 0; /* calloc's fresh pages: mapped as first touched */
    for (int i = 0; i < n_keep; i++)
        s->scratch_keep += (plan[i].bytes + 63) & ~(size_t)63;
    return ND_OK;
}

/* Needle 3's cache slots: a CLA consumer reads its producer's, every
 * other layer has its own; which slots are local layers' (read by
 * snapshots after the scratch is gone); the local layers' window. */
static int kv_map_slots(nd_kv_state *s)
{
    const san_model *m = s->m;
    const san_dims *D = &m->dims;
    if (!(s->kv_local = calloc((size_t)D->L, sizeof *s->kv_local)))
        return nd_error(ND_ENOMEM, "out of memory");
    for (int l = 0; l < D->L; l++) {
        int p = san_cla_producer(&m->cfg, l);
        if (p >= l)
            return nd_error(ND_EFORMAT, "config['cla_pairs']: layer %d reads layer %d's K/V", l, p);
        s->kv_slot[l] = p >= 0 ? s->kv_slot[p] : s->kv_layers++;
        s->kv_local[s->kv_slot[l]] = san_layer_is_local(&m->cfg, l);
        if (san_layer_is_local(&m->cfg, l) && m->cfg.sliding_window > 0) {
            int w = m->cfg.sliding_window; /* the window kv_attend gives it */
            s->lr_win = s->kv_window && s->kv_window < w ? s->kv_window : w;
        }
    }
    return ND_OK;
}

int nd_kv_init(nd_kv_state *s, const san_model *m, const nd_backend *be, int chunk, int kv_window)
{
    memset(s, 0, sizeof *s);
    const san_dims *D = &m->dims;
    if (chunk < 1)
        chunk = 1;
    if (D->hd > ND_ATT_MAX_HD)
        return nd_error(ND_ELIMIT, "head dim %d is over the engine's %d", D->hd, ND_ATT_MAX_HD);
    s->m = m;
    s->be = be;
    s->max_len = m->cfg.max_seq_len;
    s->kv_window = kv_window > 0 ? kv_window : 0;
    s->n_sink = -1;
    s->chunk = chunk;
    s->slide_rows = chunk < ND_KV_SLIDE_ROWS ? chunk : ND_KV_SLIDE_ROWS;
    int gen3 = m->cfg.generation == 3, taps = gen3 ? m->cfg.qkv_conv_taps : 0;
    if (gen3 && D->v_hd > ND_ATT_MAX_HD)
        return nd_error(ND_ELIMIT, "value head dim %d is over the engine's %d", D->v_hd,
                        ND_ATT_MAX_HD);
    size_t hsaved_row = 0;
    if (gen3) { /* the Hadamard MLP's geometry (permutations) */
        san_hada3_geom *h3 = calloc(1, sizeof *h3);
        if (!h3 || san_hada3_geom_init(h3, D->d, m->cfg.hada_factor_mode == SAN_HADA_BLOCK_UNTIED,
                                       m->cfg.n_ladder_widths > 0)) {
            free(h3);
            return nd_error(ND_ENOMEM, "out of memory (Hadamard MLP geometry)");
        }
        s->hada3 = h3;
        s->gen3 = 1;
        hsaved_row = san_hada3_saved_per_row(h3);
    }
    size_t N = (size_t)chunk, W = N + (size_t)nd_kv_max_order(m), d = (size_t)D->d,
           n = (size_t)D->n;
    size_t half = (size_t)D->hd / 2;
    kv_plan_e plan[64];
    int np = 0;
#define P(ptr, cnt) plan[np++] = (kv_plan_e){(void **)&(ptr), (size_t)(cnt) * sizeof(*(ptr))}
    /* first the values kept for the state's life (nd_kv_release_scratch
     * leaves them be), then the chunk's */
    P(s->rope_freq, half);
    if (gen3)
        P(s->kv_slot, (size_t)D->L);
    int n_keep = np;
    P(s->rope_far_cos, N * half);
    P(s->rope_far_sin, N * half);
    P(s->x0, N * d);
    P(s->X, N * n * d);
    P(s->Xn, N * n * d);
    P(s->eng_e, W * (size_t)(D->eng_dim ? D->eng_dim : 1));
    P(s->eng_idx, W * (size_t)(D->eng_tables ? D->eng_tables : 1));
    P(s->win_tok, W);
    P(s->eng_k, N * d * (size_t)(m->cfg.n_sites ? m->cfg.n_sites : 1));
    P(s->eng_v, N * d * (size_t)(m->cfg.n_sites ? m->cfg.n_sites : 1));
    P(s->eng_vp, N * d);
    san_layer_acts *A = &s->la;
    P(A->nx, N * n * d);
    P(A->pre, N * n);
    P(A->post, N * n);
    P(A->res, N * n * n);
    P(A->hpre, N * n);
    P(A->hpost, N * n);
    P(A->M, N * n * n);
    P(A->u, N * d);
    P(A->alpha, N * (size_t)(m->cfg.n_sites ? m->cfg.n_sites : 1));
    P(A->bx, N * d);
    /* Needle 2's layer (model/block.c) uses nx only for the lane mix's
     * coefficients; a, q, k, v, g, then att, o, o2, pn, x1, z, y (and
     * between layers xm, hf) live in its rows instead of their own */
    int share = !gen3 && d + (size_t)D->q_dim + D->k_dim + D->v_dim + D->gate_dim <= n * d &&
                (size_t)D->o_dim <= d && D->o_dim <= D->q_dim && (size_t)D->q_dim >= d &&
                (size_t)D->k_dim + D->v_dim >= d && (size_t)D->gate_dim >= d;
    if (!share) {
        P(A->a, N * d);
        P(A->q, N * (size_t)D->q_dim); /* Needle 2: k, v kv_dim wide, gate, att, o q_dim */
        P(A->k, N * (size_t)D->k_dim);
        P(A->v, N * (size_t)D->v_dim);
        P(A->g, N * (size_t)D->gate_dim);
        P(A->att, N * (size_t)D->o_dim);
        P(A->o, N * (size_t)D->o_dim);
    }
    if (taps) { /* the conv's outputs */
        P(A->qc, N * (size_t)D->q_dim);
        P(A->kc, N * (size_t)D->k_dim);
        P(A->vc, N * (size_t)D->v_dim);
    }
    if (gen3)
        P(A->hsaved, N * hsaved_row);
    if (!share) {
        P(A->o2, N * d);
        P(A->pn, N * d);
        P(A->x1, N * d);
        P(A->z, N * d);
        P(A->y, N * d);
        P(s->xm, N * d);
        P(s->hf, N * d);
    }
    if (!gen3)
        P(A->h1, N * (size_t)D->hada_n);
    s->att_threads = nd_get_threads();
    P(s->att_s, (size_t)s->att_threads * ND_ATT_ROWS * (size_t)(D->H / D->G) * (size_t)s->max_len);
#undef P
    int rc = kv_carve_scratch(s, plan, np, n_keep);
    if (rc) {
        nd_kv_free(s);
        return rc;
    }
    if (share)
        share_layer_rows(s, N);
    A->qn = A->q; /* q and k are normalised and rotated in place */
    A->kn = A->k;
    if (gen3 && !taps) { /* no conv: its outputs are q, k, v themselves */
        A->qc = A->q;
        A->kc = A->k;
        A->vc = A->v;
    }
    rc = gen3 ? kv_map_slots(s) : ND_OK;
    if (rc) {
        nd_kv_free(s);
        return rc;
    }
    s->cv_pin_at = s->cv_pin_want = -1;
    s->redo_from = INT_MAX;
    if (taps && conv_alloc(s, taps - 1 + ND_KV_TAIL)) {
        nd_kv_free(s);
        return nd_error(ND_ENOMEM, "out of memory (conv history)");
    }
    if (nd_layout_buf_init(&s->lay, (long)W, 1)) {
        nd_kv_free(s);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < half; i++) /* as san_rope_tables (float32, upstream's) */
        s->rope_freq[i] = 1.0f / powf((float)m->cfg.rope_theta, (float)(2 * i) / (float)D->hd);
    return ND_OK;
}

/* The rows' RoPE cos/sin, made per chunk rather than kept as [max_len]
 * tables (0.5 MB per session at needle2 shape): inside max_seq_len exactly
 * san_rope_tables' values (a float angle), past it a double angle. */
void nd_kv_rope_rows(nd_kv_state *s, long ap0, int n)
{
    size_t half = (size_t)s->m->dims.hd / 2;
    int inside = ap0 + n <= s->max_len;
    for (int t = 0; t < n; t++) {
        float *c = s->rope_far_cos + (size_t)t * half, *sn = s->rope_far_sin + (size_t)t * half;
        for (size_t i = 0; i < half; i++) {
            double ang = inside ? (double)((float)(ap0 + t) * s->rope_freq[i])
                                : (double)(ap0 + t) * s->rope_freq[i];
            c[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
    }
}

void nd_kv_use_quant(nd_kv_state *s, const nd_qweights *q)
{
    s->qw = q;
}

void nd_kv_set_bits(nd_kv_state *s, int bits)
{
    if (!s->cap) { /* the rows' format is fixed once any are stored */
        s->kv_int8 = bits == 8;
        s->vp_int8 = s->kv_int8 && s->m->dims.d % ND_VP_GROUP == 0;
    }
}

/* bytes of one cached position: token, K and V of every layer, v' rows;
 * with the local layers' ring on, their K and V go to *local instead */
static size_t row_bytes(const nd_kv_state *s, size_t *local)
{
    const san_dims *D = &s->m->dims;
    *local = 0;
    if (s->gen3) {
        size_t kv = s->kv_int8 ? (size_t)D->k_dim + D->v_dim + 2 * sizeof(float) * D->G
                               : sizeof(float) * ((size_t)D->k_dim + D->v_dim);
        size_t vp = s->vp_int8 ? (size_t)D->d + (size_t)D->d / ND_VP_GROUP * sizeof(float)
                               : (size_t)D->d * sizeof(float);
        size_t nloc = 0;
        for (int i = 0; s->lr_ring && i < s->kv_layers; i++)
            nloc += (size_t)s->kv_local[i];
        *local = nloc * kv;
        return sizeof(int32_t) + ((size_t)s->kv_layers - nloc) * kv +
               (size_t)s->m->cfg.n_sites * vp;
    }
    size_t kvd = (size_t)D->kv_dim, G = (size_t)D->G;
    size_t kv = s->kv_int8 ? kvd + G * sizeof(float) : kvd * sizeof(float);
    size_t vp = s->vp_int8 ? (size_t)D->d + (size_t)D->d / ND_VP_GROUP * sizeof(float)
                           : (size_t)D->d * sizeof(float);
    return sizeof(int32_t) + 2 * (size_t)D->L * kv + (size_t)s->m->cfg.n_sites * vp;
}

/* rows the window adds at least between two slides (drops come in
 * batches, not on every decoded token) */
static int slide_slack(const nd_kv_state *s)
{
    int slack = (s->max_len - s->n_sink) / 8;
    return slack < 1 ? 1 : slack > 64 ? 64 : slack;
}

/* most tokens one forward_chunk adds: with the window on, at most half of
 * the room after the sinks so that a slide always frees enough */
int nd_kv_chunk_step(const nd_kv_state *s)
{
    int room = (s->max_len - (s->n_sink > 0 ? s->n_sink : 0)) / 2;
    if (s->n_sink < 0 || s->chunk <= room)
        return s->chunk;
    return room > 0 ? room : 1;
}

/* the rows a slide keeps before new ones land: the sinks and the kv_window
 * - 1 newest rows, all the keys the next row attends to (and at least the
 * rows the engram's n-grams and taps and Needle 3's conv taps read back) */
static long slide_keep(const nd_kv_state *s)
{
    if (!s->kv_window)
        return (long)s->n_sink + s->max_len;
    const san_config *c = &s->m->cfg;
    long back = s->kv_window - 1, eng = (long)(SAN_CONV_TAPS - 1) * s->m->dims.eng_dilation;
    back = back > eng ? back : eng;
    back = back > nd_kv_max_order(s->m) - 1 ? back : nd_kv_max_order(s->m) - 1;
    back = back > c->qkv_conv_taps - 1 ? back : c->qkv_conv_taps - 1;
    return (long)s->n_sink + back;
}

/* The most rows a sliding cache holds: what a slide keeps plus room for
 * the next rows, one batch (a chunk, at most slide_rows) or the
 * slack whichever is more (one batch of rows serves both), at most
 * max_seq_len; with kv_window 0, max_seq_len. */
static int slide_high(const nd_kv_state *s)
{
    if (!s->kv_window)
        return s->max_len;
    int step = nd_kv_chunk_step(s), slack = slide_slack(s);
    int batch = step < s->slide_rows ? step : s->slide_rows;
    long hi = slide_keep(s) + (batch > slack ? batch : slack);
    return hi < s->max_len ? (int)hi : s->max_len;
}

int nd_kv_next_rows(const nd_kv_state *s, int want)
{
    int step = nd_kv_chunk_step(s), k = want < step ? want : step;
    if (s->n_sink < 0 || !s->kv_window)
        return k;
    int hi = slide_high(s);
    /* where the mark is max_seq_len, nd_kv_make_room slides deeper for a
     * whole chunk (nd_kv_chunk_step keeps it at most half the room) */
    if (s->len + k <= hi || hi == s->max_len)
        return k;
    /* a slide comes first: what it keeps plus these rows stay under the
     * mark (room is the batch or the slack: at least 1) */
    long room = (long)hi - slide_keep(s);
    return k > room ? (int)room : k;
}

/* capacity for `need` rows: all the rows the cache may ever hold, at once.
 * The arrays are large allocations (mmap'd, pages touched as rows are
 * written), so reserving the bound costs no memory and a growing
 * conversation never copies the cache (a copy held old + new resident). */
static int grown_cap(const nd_kv_state *s, int need)
{
    int top = s->n_sink >= 0 ? slide_high(s) : s->max_len;
    return need > top ? need : top;
}

/* the conv ring's bytes with `rows` of its rows touched, and the pinned
 * prefix's conv rows */
static size_t conv_bytes(const nd_kv_state *s, int rows)
{
    const san_dims *D = &s->m->dims;
    int taps = s->gen3 ? s->m->cfg.qkv_conv_taps : 0;
    if (!taps)
        return 0;
    size_t cw = ((size_t)D->q_dim + D->k_dim + D->v_dim) * sizeof(float);
    return (size_t)D->L * cw * ((size_t)rows + (size_t)taps - 1);
}

/* bytes of `rows` positions: the local layers' ring holds at most its own */
static size_t rows_bytes(const nd_kv_state *s, int rows)
{
    size_t local, main = row_bytes(s, &local);
    long lr = (long)s->lr_base + s->lr_ring;
    return (size_t)rows * main + (size_t)(rows < lr ? rows : lr) * local;
}

size_t nd_kv_bytes(const nd_kv_state *s)
{
    return s->scratch_bytes + rows_bytes(s, s->rows_hw) + conv_bytes(s, s->cv_hw);
}

size_t nd_kv_bytes_bound(const nd_kv_state *s)
{
    int rows = s->n_sink >= 0 ? slide_high(s) : s->max_len;
    return s->scratch_bytes + rows_bytes(s, rows > s->rows_hw ? rows : s->rows_hw) +
           conv_bytes(s, s->cv_ring);
}

void nd_kv_release_scratch(nd_kv_state *s)
{
#ifdef MADV_DONTNEED
    long pg = sysconf(_SC_PAGESIZE);
    if (!s->scratch || pg <= 0)
        return;
    uintptr_t a = (uintptr_t)s->scratch + s->scratch_keep,
              e = (uintptr_t)s->scratch + s->scratch_bytes;
    a = (a + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    e &= ~((uintptr_t)pg - 1);
    if (e > a) {
        madvise((void *)a, e - a, MADV_DONTNEED);
        s->scratch_mapped = a - (uintptr_t)s->scratch;
    }
#else
    (void)s;
#endif
}

void nd_kv_free_scratch(nd_kv_state *s)
{
    nd_qact_free(&s->qa);
    free(s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    s->scratch_keep = 0;
    s->scratch_mapped = 0;
    nd_layout_buf_free(&s->lay);
}

void nd_kv_free(nd_kv_state *s)
{
    if (!s)
        return;
    nd_kv_free_scratch(s);
    free(s->tokens);
    free(s->k);
    free(s->v);
    free(s->k8);
    free(s->v8);
    free(s->ks);
    free(s->vs);
    free(s->cv);
    free(s->cv_pin);
    free(s->kv_local);
    if (s->hada3) {
        san_hada3_geom_free(s->hada3);
        free(s->hada3);
    }
    for (int i = 0; i < SAN_MAX_SITES; i++) {
        free(s->vp[i]);
        free(s->vp8[i]);
        free(s->vps[i]);
    }
    memset(s, 0, sizeof *s);
}

/* ---- Needle 3's bounded history ----
 * The conv taps read the taps - 1 rows before each new one, a local layer
 * its last lr_win; both are rings keyed by absolute position (row +
 * evicted, so a slide moves nothing in them). What a rewind must find
 * again: the state at the pinned prefix's end (reset; cv_pin, and the
 * local rows below lr_base stay in place) and anything within ND_KV_TAIL
 * positions of len (the rings hold that much more). Anything else runs its
 * rows again from the pinned prefix's end at the next forward
 * (nd_kv_prepare): the same computation, the same rows. */

static int conv_back(const nd_kv_state *s)
{
    return s->cv ? s->m->cfg.qkv_conv_taps - 1 : 0;
}

static size_t conv_width(const nd_kv_state *s)
{
    const san_dims *D = &s->m->dims;
    return (size_t)D->q_dim + D->k_dim + D->v_dim;
}

/* whether the conv ring holds the rows row r's taps read */
static int conv_holds(const nd_kv_state *s, int r)
{
    int back = conv_back(s), m = r < back ? r : back;
    return !m || nd_kv_key(s, r) - m >= s->cv_lo;
}

/* whether the local layers' rows hold the window row r reads */
static int local_holds(const nd_kv_state *s, int r)
{
    if (!s->lr_ring || r <= s->lr_base)
        return 1;
    int lo = r - s->lr_win > s->lr_base ? r - s->lr_win : s->lr_base;
    return nd_kv_key(s, lo) >= s->lr_lo;
}

static int state_holds(const nd_kv_state *s, int r)
{
    return r <= s->redo_from && conv_holds(s, r) && local_holds(s, r);
}

/* the conv rows before row r (held) as the pinned prefix's end */
static void pin_take(nd_kv_state *s, int r)
{
    int back = conv_back(s), m = r < back ? r : back;
    size_t cw = conv_width(s);
    for (int l = 0; l < s->m->dims.L; l++)
        for (int i = 0; i < m; i++)
            memcpy(s->cv_pin + ((size_t)l * back + i) * cw,
                   nd_kv_cv_row(s, l, nd_kv_key(s, r) - m + i), cw * sizeof(float));
    s->cv_pin_at = r;
    s->cv_pin_want = -1;
}

/* the pinned prefix's end's conv rows back into the ring */
static void pin_put(nd_kv_state *s)
{
    int r = s->cv_pin_at, back = conv_back(s), m = r < back ? r : back;
    size_t cw = conv_width(s);
    for (int l = 0; l < s->m->dims.L; l++)
        for (int i = 0; i < m; i++)
            memcpy(nd_kv_cv_row(s, l, nd_kv_key(s, r) - m + i),
                   s->cv_pin + ((size_t)l * back + i) * cw, cw * sizeof(float));
    s->cv_lo = nd_kv_key(s, r) - m;
    long hw = nd_kv_key(s, r) < s->cv_ring ? nd_kv_key(s, r) : s->cv_ring;
    s->cv_hw = hw > s->cv_hw ? (int)hw : s->cv_hw;
}

void nd_kv_note_write(nd_kv_state *s, int p0, int n)
{
    long k1 = nd_kv_key(s, p0 + n);
    if (s->cv) {
        if (p0 == 0)
            s->cv_lo = nd_kv_key(s, 0);
        if (s->cv_lo < k1 - s->cv_ring)
            s->cv_lo = k1 - s->cv_ring;
        long hw = k1 < s->cv_ring ? k1 : s->cv_ring;
        s->cv_hw = hw > s->cv_hw ? (int)hw : s->cv_hw;
        if (p0 < s->cv_pin_at) { /* rows before the pinned end change: take it again */
            s->cv_pin_want = s->cv_pin_at;
            s->cv_pin_at = -1;
        }
    }
    if (s->lr_ring && p0 + n > s->lr_base) {
        if (p0 <= s->lr_base)
            s->lr_lo = nd_kv_key(s, s->lr_base);
        if (s->lr_lo < k1 - s->lr_ring)
            s->lr_lo = k1 - s->lr_ring;
    }
}

void nd_kv_note_rows(nd_kv_state *s, int p0, int n)
{
    int w = s->cv_pin_want;
    if (s->cv && w > p0 && w <= p0 + n && conv_holds(s, w))
        pin_take(s, w);
}

void nd_kv_note_call(nd_kv_state *s, int n)
{
    if (s->cv && s->n_sink < 0 && n > 1 && conv_holds(s, s->len))
        pin_take(s, s->len);
}

int nd_kv_prepare(nd_kv_state *s)
{
    int R = s->len;
    if (state_holds(s, R))
        return ND_OK;
    /* the latest point at or before R whose state is kept: the pinned
     * prefix's end, the local ring's base, or row 0 (with rows dropped,
     * only past the sinks: their positions were never run again) */
    int pin = s->n_sink > 0 ? s->n_sink : 0, P = -1;
    int cand[3] = {s->cv ? s->cv_pin_at : pin, s->lr_ring ? s->lr_base : -1, 0};
    for (int i = 0; i < 3; i++) {
        int c = cand[i];
        if (c < 0 || c > R || c > s->redo_from || (s->evicted && c < pin) || !local_holds(s, c) ||
            !(conv_holds(s, c) || c == s->cv_pin_at) || c <= P)
            continue;
        P = c;
    }
    if (P < 0)
        return nd_error(ND_ELIMIT,
                        "decoder state: rewound to position %d, past the kept conv and window rows "
                        "after rows were dropped",
                        R);
    if (!conv_holds(s, P))
        pin_put(s);
    s->len = P;
    s->redo_from = INT_MAX;
    if (R == P)
        return ND_OK;
    int32_t *t = malloc((size_t)(R - P) * sizeof *t);
    if (!t)
        return nd_error(ND_ENOMEM, "out of memory");
    memcpy(t, s->tokens + P, (size_t)(R - P) * sizeof *t);
    int rc = nd_kv_forward(s, t, R - P, NULL, 0);
    free(t);
    return rc;
}

int nd_kv_set_unbounded(nd_kv_state *s)
{
    if (s->cap || s->len)
        return nd_error(ND_EARG, "nd_kv_set_unbounded: the state already holds rows");
    s->unbounded = 1;
    int back = s->gen3 ? s->m->cfg.qkv_conv_taps - 1 : -1;
    if (back >= 0 && s->cv && conv_alloc(s, s->max_len + back))
        return nd_error(ND_ENOMEM, "out of memory (conv history)");
    return ND_OK;
}

void nd_kv_slide(nd_kv_state *s, int n_sink)
{
    s->n_sink = n_sink < 0 ? -1 : n_sink;
    if (!s->gen3)
        return;
    /* the conv rows at the pinned prefix's end: now, or when a forward
     * passes it */
    if (s->cv && s->n_sink >= 0 && s->cv_pin_at != s->n_sink) {
        if (s->n_sink <= s->len && conv_holds(s, s->n_sink)) {
            pin_take(s, s->n_sink);
        } else {
            s->cv_pin_at = -1;
            s->cv_pin_want = s->n_sink;
        }
    }
    /* the local layers' ring past the sinks, where it is smaller than the
     * rows the window keeps anyway */
    int ring = 0, base = s->n_sink;
    if (s->lr_win > 0 && !s->unbounded && base >= 0) {
        long r = (long)s->lr_win + (s->chunk > ND_KV_TAIL ? s->chunk : ND_KV_TAIL);
        if (base + r < slide_high(s) && (!s->cap || base + r <= s->cap))
            ring = (int)r;
    }
    if (ring == s->lr_ring && (!ring || base == s->lr_base))
        return;
    /* rows past the lower base are laid out the old way: run them again */
    int lo = s->lr_ring ? s->lr_base : INT_MAX, lo2 = ring ? base : INT_MAX;
    lo = lo < lo2 ? lo : lo2;
    if (s->len > lo && lo < s->redo_from)
        s->redo_from = lo;
    s->lr_ring = ring;
    s->lr_base = ring ? base : 0;
    s->lr_lo = nd_kv_key(s, s->lr_base);
}

void nd_kv_rewind(nd_kv_state *s, int len)
{
    if (len < s->len)
        s->len = len < 0 ? 0 : len;
    if (s->len <= (s->n_sink > 0 ? s->n_sink : 0)) {
        if (s->evicted) /* positions restart: the rings' keys of the rows kept change */
            s->cv_lo = s->len;
        s->evicted = 0; /* back inside the sinks: positions restart */
    }
}

/* The per-position arrays of a state: [layers][cap][row] each, named by
 * the address of their pointer (growing replaces it). One list for
 * growing, sliding, snapshots and restores, so the cache's layout is
 * written down once. */
typedef struct {
    void **slot;
    size_t layers, row;
    int per_slot; /* layers are Needle 3 cache slots (a local one may be a ring) */
} kv_array;

#define KV_ARRAYS_MAX (8 + 2 * SAN_MAX_SITES)

static int kv_arrays(nd_kv_state *s, kv_array *a)
{
    const san_dims *D = &s->m->dims;
    size_t L = (size_t)D->L, kvd = (size_t)D->kv_dim, G = (size_t)D->G, d = (size_t)D->d;
    int n = 0;
    a[n++] = (kv_array){(void **)&s->tokens, 1, sizeof(int32_t), 0};
    if (s->gen3) { /* [slot][cap][k_dim | v_dim], int8 rows with [slot][cap][G] scales */
        size_t kl = (size_t)s->kv_layers;
        if (s->kv_int8) {
            a[n++] = (kv_array){(void **)&s->k8, kl, (size_t)D->k_dim, 1};
            a[n++] = (kv_array){(void **)&s->v8, kl, (size_t)D->v_dim, 1};
            a[n++] = (kv_array){(void **)&s->ks, kl, G * sizeof(float), 1};
            a[n++] = (kv_array){(void **)&s->vs, kl, G * sizeof(float), 1};
        } else {
            a[n++] = (kv_array){(void **)&s->k, kl, (size_t)D->k_dim * sizeof(float), 1};
            a[n++] = (kv_array){(void **)&s->v, kl, (size_t)D->v_dim * sizeof(float), 1};
        }
    } else if (s->kv_int8) {
        a[n++] = (kv_array){(void **)&s->k8, L * G, (size_t)D->hd, 0};
        a[n++] = (kv_array){(void **)&s->v8, L * G, (size_t)D->hd, 0};
        a[n++] = (kv_array){(void **)&s->ks, L, G * sizeof(float), 0};
        a[n++] = (kv_array){(void **)&s->vs, L, G * sizeof(float), 0};
    } else {
        a[n++] = (kv_array){(void **)&s->k, L, kvd * sizeof(float), 0};
        a[n++] = (kv_array){(void **)&s->v, L, kvd * sizeof(float), 0};
    }
    for (int i = 0; i < s->m->cfg.n_sites; i++) {
        if (!s->vp_int8) {
            a[n++] = (kv_array){(void **)&s->vp[i], 1, d * sizeof(float), 0};
            continue;
        }
        a[n++] = (kv_array){(void **)&s->vp8[i], 1, d, 0};
        a[n++] = (kv_array){(void **)&s->vps[i], 1, d / ND_VP_GROUP * sizeof(float), 0};
    }
    return n;
}

/* Re-allocate a [layers][cap][row] array for a larger cap, keeping the
 * first len rows of every layer. */
static int grow_rows(void **arr, size_t layers, int old_cap, int cap, int len, size_t row)
{
    char *n = malloc(layers * (size_t)cap * row + 1), *o = *arr;
    if (!n)
        return ND_ENOMEM;
    for (size_t l = 0; l < layers && len; l++)
        memcpy(n + l * (size_t)cap * row, o + l * (size_t)old_cap * row, (size_t)len * row);
    free(*arr);
    *arr = n;
    return ND_OK;
}

/* Grow the per-position storage to hold `need` positions. */
int nd_kv_reserve(nd_kv_state *s, int need)
{
    if (need > s->cap) {
        int cap = grown_cap(s, need), rc = ND_OK;
        kv_array a[KV_ARRAYS_MAX];
        int na = kv_arrays(s, a);
        for (int i = 0; i < na && !rc; i++)
            rc = grow_rows(a[i].slot, a[i].layers, s->cap, cap, s->len, a[i].row);
        s->faulted = s->len; /* new arrays: only the copied rows are mapped */
        if (rc)              /* arrays grown so far hold more rows; s->cap stays the safe bound */
            return nd_error(ND_ENOMEM, "out of memory growing the KV cache to %d positions", cap);
        s->cap = cap;
    }
    s->rows_hw = need > s->rows_hw ? need : s->rows_hw;
    return ND_OK;
}

/* rows a decode step maps ahead: a page of one kv head's int8 rows (64 of
 * 64 bytes) faults once per 64 steps in each of L * G blocks otherwise */
#define ND_KV_MAP_AHEAD 64

/* Before a call writes n rows: reserve them and map their pages now, each
 * layer's new rows in one nd_prefault each (a 256-token prompt took ~1,000
 * page faults as its layers wrote, ~15% of its time under
 * virtualisation). Never past the rows the cache can hold (slide_high), so
 * the resident bound (nd_kv_bytes_bound) is the same. */
int nd_kv_map_rows(nd_kv_state *s, int n)
{
    if ((long)s->len + n <= s->faulted)
        return ND_OK;
    int top = s->n_sink >= 0 ? slide_high(s) : s->max_len;
    long want = (long)s->len + (n > ND_KV_MAP_AHEAD ? n : ND_KV_MAP_AHEAD);
    int hi = want < top ? (int)want : top;
    if (hi <= s->faulted)
        return ND_OK;
    int rc = nd_kv_reserve(s, hi);
    if (rc)
        return rc;
    kv_array a[KV_ARRAYS_MAX];
    int na = kv_arrays(s, a), lo = s->faulted;
    for (int i = 0; i < na; i++)
        for (size_t l = 0; l < a[i].layers; l++) {
            int end = hi; /* a local layer's ring holds no more than its own rows */
            if (a[i].per_slot && s->lr_ring && s->kv_local[l] && end > s->lr_base + s->lr_ring)
                end = s->lr_base + s->lr_ring;
            if (end > lo)
                nd_prefault((char *)*a[i].slot + ((size_t)l * s->cap + (size_t)lo) * a[i].row,
                            (size_t)(end - lo) * a[i].row);
        }
    s->faulted = hi;
    return ND_OK;
}

/* A prompt's chunk writes most of the scratch: its pages (new, or given
 * back between turns by nd_kv_release_scratch) are mapped in one call. */
void nd_kv_map_scratch(nd_kv_state *s)
{
    if (s->scratch && s->scratch_mapped < s->scratch_bytes) {
        nd_prefault((char *)s->scratch + s->scratch_mapped, s->scratch_bytes - s->scratch_mapped);
        s->scratch_mapped = s->scratch_bytes;
    }
}

/* Drop rows [pin, pin + drop) of every layer of a [layers][cap][row] array. */
static void drop_rows(void *arr, size_t layers, int cap, int pin, int drop, int len, size_t row)
{
    char *base = arr;
    for (size_t l = 0; l < layers; l++) {
        char *lb = base + l * (size_t)cap * row;
        memmove(lb + (size_t)pin * row, lb + (size_t)(pin + drop) * row,
                (size_t)(len - pin - drop) * row);
    }
}

/* Sliding window: before n new rows land, drop the oldest unpinned rows
 * once the cache would pass its high mark (upstream keeps the sinks and
 * the last kv_window keys visible; nothing else is ever read again). */
int nd_kv_make_room(nd_kv_state *s, int n)
{
    int pin = s->n_sink, hi = slide_high(s);
    if (s->len + n <= hi)
        return ND_OK;
    long keep = slide_keep(s);
    if (keep > (long)hi - n) /* the high mark is max_seq_len: slide a batch */
        keep = (long)hi - n - slide_slack(s);
    if (keep < pin)
        keep = pin;
    if (keep + n > s->max_len)
        return nd_error(ND_ELIMIT, "%d new tokens after %d pinned ones exceed max_seq_len %d", n,
                        pin, s->max_len);
    int drop = s->len - (int)keep;
    if (drop <= 0)
        return ND_OK;
    kv_array a[KV_ARRAYS_MAX];
    int na = kv_arrays(s, a);
    for (int i = 0; i < na; i++)
        for (size_t l = 0; l < a[i].layers; l++) /* a local layer's ring moves nothing */
            if (!(a[i].per_slot && s->lr_ring && s->kv_local[l]))
                drop_rows((char *)*a[i].slot + l * (size_t)s->cap * a[i].row, 1, s->cap, pin, drop,
                          s->len, a[i].row);
    s->len -= drop;
    s->evicted += drop;
    /* the sinks' keys moved: the conv ring holds none of them now */
    if (s->cv && s->cv_lo < nd_kv_key(s, pin))
        s->cv_lo = nd_kv_key(s, pin);
    return ND_OK;
}

/* rows [0, len) of every array, then the conv rows before row len (from
 * the pinned prefix's end, or from the ring where `owner`: the caller is
 * the state's own thread); a local layer's ring read through its mapping
 * where `mapped` */
static int snapshot_impl(const nd_kv_state *s, int len, nd_kv_snap *out, int owner, int mapped)
{
    memset(out, 0, sizeof *out);
    kv_array a[KV_ARRAYS_MAX];
    int na = kv_arrays((nd_kv_state *)s, a); /* read through the slots only */
    int back = conv_back(s), m = len < back ? len : back;
    size_t cw = conv_width(s), conv = (size_t)s->m->dims.L * (size_t)m * cw * sizeof(float);
    const float *cv_src = NULL;
    if (m && len == s->cv_pin_at)
        cv_src = s->cv_pin;
    else if (m && !(owner && len <= s->len && conv_holds(s, len)))
        return nd_error(ND_EARG, "snapshot of %d rows: the conv rows before them are not kept",
                        len);
    if (mapped && !local_holds(s, len))
        return nd_error(ND_EARG, "snapshot of %d rows: the local layers' rows are not kept", len);
    size_t bytes = conv;
    for (int i = 0; i < na; i++)
        bytes += a[i].layers * (size_t)len * a[i].row;
    if (!(out->data = malloc(bytes + 1)))
        return nd_error(ND_ENOMEM, "out of memory snapshotting %d KV rows", len);
    char *p = out->data;
    for (int i = 0; i < na; i++)
        for (size_t l = 0; l < a[i].layers; l++) {
            const char *base = (char *)*a[i].slot + l * (size_t)s->cap * a[i].row;
            size_t n = (size_t)len * a[i].row;
            if (mapped && a[i].per_slot && s->kv_local[l]) {
                for (int r = 0; r < len; r++) /* rows the window no longer reads: zero */
                    if (r < s->lr_base || r >= len - s->lr_win)
                        memcpy(p + (size_t)r * a[i].row,
                               base + (size_t)nd_kv_slot_row(s, (int)l, r) * a[i].row, a[i].row);
                    else
                        memset(p + (size_t)r * a[i].row, 0, a[i].row);
            } else {
                memcpy(p, base, n);
            }
            p += n;
        }
    for (int l = 0; l < s->m->dims.L; l++)
        for (int i = 0; i < m; i++, p += cw * sizeof(float))
            memcpy(p,
                   cv_src ? cv_src + ((size_t)l * back + i) * cw
                          : nd_kv_cv_row(s, l, nd_kv_key(s, len) - m + i),
                   cw * sizeof(float));
    out->len = len;
    out->kv_int8 = s->kv_int8;
    out->bytes = bytes;
    return ND_OK;
}

int nd_kv_snapshot(const nd_kv_state *s, int len, nd_kv_snap *out)
{
    memset(out, 0, sizeof *out);
    if (len < 0 || len > s->len || (s->evicted && len > s->n_sink))
        return nd_error(ND_EARG, "snapshot of %d rows: the state holds %d from position 0", len,
                        s->evicted ? s->n_sink : s->len);
    if (len > s->redo_from)
        return nd_error(ND_EARG, "snapshot of %d rows: they are to be run again", len);
    return snapshot_impl(s, len, out, 1, s->lr_ring && len > s->lr_base);
}

/* Reads only what is fixed once rows are stored (the arrays, cap, the
 * format, the pinned prefix's conv rows), never len: another thread's
 * prefix cache copies lent rows while their session appends after them.
 * The rows are the pinned prefix's (in place in every layer). */
int nd_kv_snapshot_rows(const nd_kv_state *s, int len, nd_kv_snap *out)
{
    return snapshot_impl(s, len, out, 0, 0);
}

int nd_kv_restore(nd_kv_state *s, const nd_kv_snap *snap)
{
    if (snap->kv_int8 != s->kv_int8 || snap->len > s->max_len)
        return nd_error(ND_EARG, "KV snapshot does not fit this state");
    s->len = 0;
    s->evicted = 0;
    int rc = nd_kv_reserve(s, snap->len > 0 ? snap->len : 1);
    if (rc)
        return rc;
    kv_array a[KV_ARRAYS_MAX];
    int na = kv_arrays(s, a), len = snap->len;
    const char *p = snap->data;
    for (int i = 0; i < na; i++)
        for (size_t l = 0; l < a[i].layers; l++) {
            char *base = (char *)*a[i].slot + l * (size_t)s->cap * a[i].row;
            size_t n = (size_t)len * a[i].row;
            if (a[i].per_slot && s->lr_ring && s->kv_local[l] && len > s->lr_base) {
                for (int r = 0; r < len; r++)
                    if (r < s->lr_base || r >= len - s->lr_win)
                        memcpy(base + (size_t)nd_kv_slot_row(s, (int)l, r) * a[i].row,
                               p + (size_t)r * a[i].row, a[i].row);
            } else {
                memcpy(base, p, n);
            }
            p += n;
        }
    nd_kv_note_write(s, 0, len); /* what the rings now hold: the local window's rows */
    if (s->lr_ring && len - s->lr_win > s->lr_base)
        s->lr_lo = nd_kv_key(s, len - s->lr_win);
    int back = conv_back(s), m = len < back ? len : back;
    size_t cw = conv_width(s);
    for (int l = 0; l < s->m->dims.L; l++)
        for (int i = 0; i < m; i++, p += cw * sizeof(float)) {
            memcpy(nd_kv_cv_row(s, l, (long)len - m + i), p, cw * sizeof(float));
            memcpy(s->cv_pin + ((size_t)l * back + i) * cw, p, cw * sizeof(float));
        }
    if (s->cv) {
        s->cv_lo = len - m;
        s->cv_pin_at = len;
        s->cv_pin_want = -1;
    }
    s->redo_from = INT_MAX;
    s->len = len;
    return ND_OK;
}

void nd_kv_snap_free(nd_kv_snap *snap)
{
    free(snap->data);
    memset(snap, 0, sizeof *snap);
}

/* q = round(x / scale) with scale = max|x| / 127 (1 for a zero row), as
 * int8; returns the scale. Written so both loops vectorise: the absolute
 * values' bit patterns order as the values do (finite inputs), and adding
 * and removing 1.5 * 2^23 rounds to nearest-even as lrintf does for
 * |x / scale| <= 127. */
static float quant_row_i8(const float *x, int8_t *q, size_t n)
{
    uint32_t mb = 0;
    for (size_t e = 0; e < n; e++) {
        uint32_t b;
        memcpy(&b, x + e, 4);
        b &= 0x7fffffffu;
        mb = b > mb ? b : mb;
    }
    float mx;
    memcpy(&mx, &mb, 4);
    float scale = mx > 0.0f ? mx / 127.0f : 1.0f, inv = 1.0f / scale;
    for (size_t e = 0; e < n; e++)
        q[e] = (int8_t)(int)((x[e] * inv + 12582912.0f) - 12582912.0f);
    return scale;
}

void nd_kv_store_vp_rows(nd_kv_state *s, int site, int p0, int n)
{
    int d = s->m->dims.d, ng = d / ND_VP_GROUP;
    for (int i = 0; i < n; i++)
        for (int g = 0; g < ng; g++) {
            const float *x = s->eng_vp + (size_t)i * d + (size_t)g * ND_VP_GROUP;
            int8_t *q = s->vp8[site] + (size_t)(p0 + i) * d + (size_t)g * ND_VP_GROUP;
            s->vps[site][(size_t)(p0 + i) * ng + (size_t)g] = quant_row_i8(x, q, ND_VP_GROUP);
        }
}

const float *nd_kv_vp_row(nd_kv_state *s, int site, int r)
{
    int d = s->m->dims.d, ng = d / ND_VP_GROUP;
    const int8_t *q = s->vp8[site] + (size_t)r * d;
    const float *sc = s->vps[site] + (size_t)r * ng;
    for (int x = 0; x < d; x++)
        s->eng_vp[x] = (float)q[x] * sc[x / ND_VP_GROUP];
    return s->eng_vp;
}

/* float32 rows, or int8 with one absmax scale per (row, kv head) */
void nd_kv_store_rows(nd_kv_state *s, int l, int p0, int n, const float *k, const float *v)
{
    const san_dims *D = &s->m->dims;
    if (s->gen3) { /* rows in the layer's slot: float, or int8 per (row, kv head) */
        int slot = s->kv_slot[l];
        size_t kd = (size_t)D->k_dim, vd = (size_t)D->v_dim, sc = (size_t)slot * s->cap;
        size_t G = (size_t)D->G, hd = (size_t)D->hd, vhd = (size_t)D->v_hd;
        if (!s->kv_int8) { /* row by row: a local layer's ring wraps */
            for (size_t i = 0; i < (size_t)n; i++) {
                size_t row = sc + (size_t)nd_kv_slot_row(s, slot, p0 + (int)i);
                memcpy(s->k + row * kd, k + i * kd, kd * sizeof(float));
                memcpy(s->v + row * vd, v + i * vd, vd * sizeof(float));
            }
            return;
        }
        for (size_t i = 0; i < (size_t)n; i++) {
            size_t row = sc + (size_t)nd_kv_slot_row(s, slot, p0 + (int)i);
            for (size_t g = 0; g < G; g++) {
                s->ks[row * G + g] =
                    quant_row_i8(k + i * kd + g * hd, s->k8 + row * kd + g * hd, hd);
                s->vs[row * G + g] =
                    quant_row_i8(v + i * vd + g * vhd, s->v8 + row * vd + g * vhd, vhd);
            }
        }
        return;
    }
    size_t kvd = (size_t)D->kv_dim, G = (size_t)D->G, hd = (size_t)D->hd;
    size_t lc = (size_t)l * s->cap;
    if (!s->kv_int8) {
        memcpy(s->k + (lc + (size_t)p0) * kvd, k, (size_t)n * kvd * sizeof(float));
        memcpy(s->v + (lc + (size_t)p0) * kvd, v, (size_t)n * kvd * sizeof(float));
        return;
    }
    for (int side = 0; side < 2; side++) {
        const float *src = side ? v : k;
        float *sc = (side ? s->vs : s->ks) + (lc + (size_t)p0) * G;
        for (size_t r = 0; r < (size_t)n * G; r++) {
            const float *x = src + r * hd;
            int8_t *dst = nd_kv_row8(s, side ? s->v8 : s->k8, l, (int)(r % G), p0 + (int)(r / G));
            sc[r] = quant_row_i8(x, dst, hd);
        }
    }
}

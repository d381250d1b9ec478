/* RoPE and causal GQA attention on Vulkan, forward and backward.
 *
 * Attention is flash style: a workgroup owns ATTN_ROWS consecutive rows of
 * one segment and one head (forward, dq) or kv head (dk/dv), streams the
 * other side through shared memory in small tiles, and never stores a
 * score matrix. The backward is three dispatches with no atomics:
 * D = rowsum(dout * out) into a scratch buffer, then dq per (query block,
 * head) over its keys, then dk/dv per (key block, kv head) over every query
 * row that sees those keys, in a fixed order (own segment, then each child
 * segment in index order; heads of the group in order). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/vulkan/vk_ops.h"

/* rows per workgroup: must match ROWS in the attn_*.comp shaders */
#define ATTN_ROWS 16

static void vk_rope_common(float *x, const float *cos_t, const float *sin_t, const nd_layout *L,
                           int heads, int hd, int backward)
{
    if (L->N <= 0 || heads <= 0 || hd < 2)
        return;
    int half = hd / 2;
    /* the tables are read up to the largest position in use */
    int max_pos = 0;
    for (long r = 0; r < L->N; r++)
        max_pos = L->pos[r] > max_pos ? L->pos[r] : max_pos;
    size_t tab = (size_t)(max_pos + 1) * half * 4;
    struct {
        uint64_t x, cos_t, sin_t, lay;
        int32_t N, n_seg, heads, hd, backward;
    } a;
    a.cos_t = vk_in(cos_t, tab);
    a.sin_t = vk_in(sin_t, tab);
    a.lay = vk_layout(L);
    a.x = vk_out(x, (size_t)L->N * heads * hd * 4);
    a.N = vk_i32(L->N);
    a.n_seg = L->n_seg;
    a.heads = heads;
    a.hd = hd;
    a.backward = backward;
    long total = L->N * heads * (long)half;
    vk_i32(total);
    vk_dispatch("rope", &a, sizeof a, vk_groups(total, 256), 1, 1);
}

void vk_rope(const nd_backend *be, float *x, const float *cos_t, const float *sin_t,
             const nd_layout *L, int heads, int hd)
{
    (void)be;
    vk_rope_common(x, cos_t, sin_t, L, heads, hd, 0);
}

void vk_rope_backward(const nd_backend *be, float *dx, const float *cos_t, const float *sin_t,
                      const nd_layout *L, int heads, int hd)
{
    (void)be;
    vk_rope_common(dx, cos_t, sin_t, L, heads, hd, 1);
}

/* Host-side tables, copied into the staging ring at issue time (so the
 * buffers are reused from call to call): blocks of ATTN_ROWS rows as
 * (segment, first row in the segment), once ordered for the query-side
 * kernels (attn_fwd, attn_bwd_dq) and once for the key-side one
 * (attn_bwd_dkdv), heaviest first so that long blocks do not start last;
 * and each segment's children as offsets [n_seg + 1] into a list. The
 * order changes only scheduling: every block writes its own rows. */
typedef struct {
    int32_t seg, t0;
    long work; /* keys a query block sees, or queries a key block sends to */
} attn_block;

static struct {
    attn_block *sort;
    int32_t *qblocks, *kblocks, *child_off, *child_list;
    long cap_blocks;
    int cap_seg;
    long n_blocks;
    int n_children;
} T;

static int by_work_desc(const void *x, const void *y)
{
    const attn_block *a = x, *b = y;
    if (a->work != b->work)
        return a->work > b->work ? -1 : 1;
    if (a->seg != b->seg)
        return a->seg < b->seg ? -1 : 1;
    return a->t0 < b->t0 ? -1 : a->t0 > b->t0;
}

static void fill_blocks(int32_t *dst, long n)
{
    qsort(T.sort, (size_t)n, sizeof *T.sort, by_work_desc);
    for (long b = 0; b < n; b++) {
        dst[2 * b] = T.sort[b].seg;
        dst[2 * b + 1] = T.sort[b].t0;
    }
}

static void attn_tables(const nd_layout *L)
{
    long nb = 0;
    for (int s = 0; s < L->n_seg; s++)
        nb += (L->seg[s].len + ATTN_ROWS - 1) / ATTN_ROWS;
    if (nb + 1 > T.cap_blocks) {
        T.cap_blocks = 2 * (nb + 1);
        free(T.sort);
        free(T.qblocks);
        free(T.kblocks);
        T.sort = malloc(sizeof *T.sort * (size_t)T.cap_blocks);
        T.qblocks = malloc(sizeof *T.qblocks * 2 * (size_t)T.cap_blocks);
        T.kblocks = malloc(sizeof *T.kblocks * 2 * (size_t)T.cap_blocks);
    }
    if (L->n_seg + 1 > T.cap_seg) {
        T.cap_seg = 2 * (L->n_seg + 1);
        free(T.child_off);
        free(T.child_list);
        T.child_off = malloc(sizeof *T.child_off * (size_t)T.cap_seg);
        T.child_list = malloc(sizeof *T.child_list * (size_t)T.cap_seg);
    }
    if (!T.sort || !T.qblocks || !T.kblocks || !T.child_off || !T.child_list)
        abort(); /* a few bytes per block: nothing sensible to do without them */
    T.n_blocks = nb;

    /* children of each segment, in index order (counting sort by parent) */
    memset(T.child_off, 0, sizeof *T.child_off * (size_t)(L->n_seg + 1));
    for (int s = 0; s < L->n_seg; s++)
        if (L->seg[s].parent >= 0)
            T.child_off[L->seg[s].parent + 1]++;
    for (int s = 0; s < L->n_seg; s++)
        T.child_off[s + 1] += T.child_off[s];
    T.n_children = T.child_off[L->n_seg];
    /* child_off[p] serves as p's fill cursor, then is shifted back */
    for (int s = 0; s < L->n_seg; s++) {
        int p = L->seg[s].parent;
        if (p >= 0)
            T.child_list[T.child_off[p]++] = s;
    }
    for (int s = L->n_seg; s > 0; s--)
        T.child_off[s] = T.child_off[s - 1];
    T.child_off[0] = 0;

    long b = 0;
    for (int s = 0; s < L->n_seg; s++) {
        const nd_segment *sg = &L->seg[s];
        int plen = sg->parent >= 0 ? L->seg[sg->parent].len : 0;
        for (int t0 = 0; t0 < sg->len; t0 += ATTN_ROWS) {
            int t1 = t0 + ATTN_ROWS < sg->len ? t0 + ATTN_ROWS : sg->len;
            T.sort[b++] = (attn_block){s, t0, (long)plen + t1};
        }
    }
    fill_blocks(T.qblocks, nb);
    b = 0;
    for (int s = 0; s < L->n_seg; s++) {
        long from_children = 0;
        for (int c = T.child_off[s]; c < T.child_off[s + 1]; c++)
            from_children += L->seg[T.child_list[c]].len;
        for (int t0 = 0; t0 < L->seg[s].len; t0 += ATTN_ROWS)
            T.sort[b++] = (attn_block){s, t0, L->seg[s].len - t0 + from_children};
    }
    fill_blocks(T.kblocks, nb);
}

void vk_attention(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                  const float *v, const nd_layout *L, int H, int G, int hd)
{
    vk_attention_ext(be, out, lse, q, k, v, L, H, G, hd, hd, 0);
}

static void attn_check(int H, int G, int hd, int vd)
{
    if (hd > 128 || vd > 128 || hd <= 0 || vd <= 0 || G <= 0 || H % G) {
        fprintf(stderr, "needle: vulkan attention: needs head dims in 1..128 and H %% G == 0\n");
        abort();
    }
}

void vk_attention_ext(const nd_backend *be, float *out, float *lse, const float *q, const float *k,
                      const float *v, const nd_layout *L, int H, int G, int hd, int vd, int window)
{
    (void)be;
    if (L->N <= 0 || H <= 0)
        return;
    attn_check(H, G, hd, vd);
    attn_tables(L);
    if (!T.n_blocks)
        return;
    size_t nq = (size_t)L->N * H * hd, nk = (size_t)L->N * G * hd;
    size_t no = (size_t)L->N * H * vd, nv = (size_t)L->N * G * vd;
    vk_i32((long)nq); /* the shaders index with int32 */
    vk_i32((long)no);
    struct {
        uint64_t out, lse, q, k, v, lay, blocks;
        int32_t N, n_seg, n_blocks, H, G, hd, vd, window;
        float scale;
    } a;
    a.q = vk_in(q, nq * 4);
    a.k = vk_in(k, nk * 4);
    a.v = vk_in(v, nv * 4);
    a.lay = vk_layout(L);
    a.blocks = vk_in(T.qblocks, (size_t)T.n_blocks * 2 * 4);
    a.out = vk_out(out, no * 4);
    a.lse = vk_out_opt(lse, (size_t)L->N * H * 4);
    a.N = vk_i32(L->N);
    a.n_seg = L->n_seg;
    a.n_blocks = vk_i32(T.n_blocks);
    a.H = H;
    a.G = G;
    a.hd = hd;
    a.vd = vd;
    a.window = window > 0 ? window : 0;
    a.scale = 1.0f / sqrtf((float)hd);
    vk_dispatch("attn_fwd", &a, sizeof a, vk_groups(T.n_blocks, 1), (uint32_t)H, 1);
}

/* D = rowsum(dout * out) per (row, head), grown on demand */
static float *attn_delta;
static size_t attn_delta_bytes;

void vk_attention_backward(const nd_backend *be, float *dq, float *dk, float *dv, const float *dout,
                           const float *q, const float *k, const float *v, const float *out,
                           const float *lse, const nd_layout *L, int H, int G, int hd)
{
    vk_attention_ext_backward(be, dq, dk, dv, dout, q, k, v, out, lse, L, H, G, hd, hd, 0);
}

void vk_attention_ext_backward(const nd_backend *be, float *dq, float *dk, float *dv,
                               const float *dout, const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const nd_layout *L, int H, int G,
                               int hd, int vd, int window)
{
    (void)be;
    if (L->N <= 0 || H <= 0)
        return;
    attn_check(H, G, hd, vd);
    attn_tables(L);
    if (!T.n_blocks)
        return;
    size_t nq = (size_t)L->N * H * hd, nk = (size_t)L->N * G * hd, nl = (size_t)L->N * H;
    size_t no = (size_t)L->N * H * vd, nv = (size_t)L->N * G * vd;
    vk_i32((long)nq); /* the shaders index with int32 */
    vk_i32((long)no);
    window = window > 0 ? window : 0;
    if (nl * 4 > attn_delta_bytes) {
        vk_free(attn_delta); /* syncs: recorded dispatches may still use it */
        attn_delta_bytes = nl * 4 * 2;
        attn_delta = vk_alloc(attn_delta_bytes);
        if (!attn_delta) {
            fprintf(stderr, "needle: vulkan attention: out of device memory\n");
            abort();
        }
    }
    float scale = 1.0f / sqrtf((float)hd);

    struct {
        uint64_t delta, dout, out;
        int32_t rows, hd;
    } d;
    d.dout = vk_in(dout, no * 4);
    d.out = vk_in(out, no * 4);
    d.delta = vk_out(attn_delta, nl * 4);
    d.rows = vk_i32((long)nl);
    d.hd = vd;
    vk_dispatch("attn_bwd_delta", &d, sizeof d, vk_groups((long)nl, 256), 1, 1);

    struct {
        uint64_t dq, dout, q, k, v, lse, delta, lay, blocks;
        int32_t N, n_seg, n_blocks, H, G, hd, vd, window;
        float scale;
    } a;
    a.dout = vk_in(dout, no * 4);
    a.q = vk_in(q, nq * 4);
    a.k = vk_in(k, nk * 4);
    a.v = vk_in(v, nv * 4);
    a.lse = vk_in(lse, nl * 4);
    a.delta = vk_in(attn_delta, nl * 4);
    a.lay = vk_layout(L);
    a.blocks = vk_in(T.qblocks, (size_t)T.n_blocks * 2 * 4);
    a.dq = vk_out(dq, nq * 4);
    a.N = vk_i32(L->N);
    a.n_seg = L->n_seg;
    a.n_blocks = vk_i32(T.n_blocks);
    a.H = H;
    a.G = G;
    a.hd = hd;
    a.vd = vd;
    a.window = window;
    a.scale = scale;
    vk_dispatch("attn_bwd_dq", &a, sizeof a, vk_groups(T.n_blocks, 1), (uint32_t)H, 1);

    struct {
        uint64_t dk, dv, dout, q, k, v, lse, delta, lay, blocks, child_off, child_list;
        int32_t N, n_seg, n_blocks, H, G, hd, vd, window;
        float scale;
    } b;
    b.dout = vk_in(dout, no * 4);
    b.q = vk_in(q, nq * 4);
    b.k = vk_in(k, nk * 4);
    b.v = vk_in(v, nv * 4);
    b.lse = vk_in(lse, nl * 4);
    b.delta = vk_in(attn_delta, nl * 4);
    b.lay = vk_layout(L);
    b.blocks = vk_in(T.kblocks, (size_t)T.n_blocks * 2 * 4);
    b.child_off = vk_in(T.child_off, (size_t)(L->n_seg + 1) * 4);
    b.child_list = vk_in(T.child_list, (size_t)(T.n_children ? T.n_children : 1) * 4);
    b.dk = vk_out(dk, nk * 4);
    b.dv = vk_out(dv, nv * 4);
    b.N = vk_i32(L->N);
    b.n_seg = L->n_seg;
    b.n_blocks = vk_i32(T.n_blocks);
    b.H = H;
    b.G = G;
    b.hd = hd;
    b.vd = vd;
    b.window = window;
    b.scale = scale;
    vk_dispatch("attn_bwd_dkdv", &b, sizeof b, vk_groups(T.n_blocks, 1), (uint32_t)G, 1);
}

/* Embedding, engram (hash, gather, taps, gate), row gather/scatter and
 * cross-entropy on Vulkan, forward and backward.
 *
 * Scatter-adds (embedding and row gradients, engram tables) are
 * deterministic without atomics: every destination row has one owner that
 * adds its sources in increasing row order, as the CPU does. For host index
 * lists (tokens, rows) the host groups the rows by destination; engram
 * indices live on the device, so a shader links rows with equal indices
 * there. Row reductions (dtaps) go through per-chunk partial sums added in
 * chunk order by a second dispatch. */
#include <string.h>

#include "backend/vulkan/vk_ops.h"

/* ---- scratch ---- */

/* Device scratch shared by this group's ops, grown on demand (vk_free
 * syncs, so it is never shrunk). Ops that reuse it are ordered by the
 * runtime's hazard barriers like any other array. */
static void *dev_scratch;
static size_t dev_scratch_bytes;

/* Call it before an op stages anything: growing syncs, and a sync recycles
 * the staging ring (addresses from vk_in / vk_layout on host data). */
static void *scratch_dev(size_t bytes)
{
    if (bytes > dev_scratch_bytes) {
        vk_free(dev_scratch);
        dev_scratch_bytes = bytes > 2 * dev_scratch_bytes ? bytes : 2 * dev_scratch_bytes;
        dev_scratch = vk_alloc(dev_scratch_bytes);
        if (!dev_scratch)
            abort();
    }
    return dev_scratch;
}

/* Host scratch for grouping index lists (its content is staged by vk_in at
 * issue, so it may be reused by the next op at once). */
static int32_t *host_scratch;
static size_t host_scratch_n;

static int32_t *scratch_host(size_t n)
{
    if (n > host_scratch_n) {
        free(host_scratch);
        host_scratch_n = n > 2 * host_scratch_n ? n : 2 * host_scratch_n;
        host_scratch = malloc(host_scratch_n * sizeof *host_scratch);
        if (!host_scratch)
            abort();
    }
    return host_scratch;
}

/* Largest entry of a host-readable index list (tokens, rows): the extent of
 * the table it indexes. Index lists are host data (backend.h's memory rule),
 * or alloc memory the host wrote itself. */
static long max_index(const int32_t *ix, long n)
{
    long m = 0;
    for (long i = 0; i < n; i++)
        m = ix[i] > m ? ix[i] : m;
    return m;
}

/* dst[keys[i]] += src[i] * scale (rows of d floats), each destination row
 * summing its rows in increasing i. The rows are grouped by key with a
 * stable counting sort: order[N], gstart[G + 1], gkey[G] in one block. */
static void scatter_rows(float *dst, const float *src, const int32_t *keys, long n, int d,
                         float scale)
{
    if (n <= 0 || d <= 0)
        return;
    long n_keys = max_index(keys, n) + 1;
    int32_t *buf = scratch_host((size_t)n_keys + 1 + (size_t)3 * n + 1);
    int32_t *count = buf; /* [n_keys + 1], then the block */
    int32_t *order = count + n_keys + 1;
    memset(count, 0, sizeof *count * (size_t)(n_keys + 1));
    for (long i = 0; i < n; i++)
        count[keys[i] + 1]++;
    long groups = 0;
    for (long k = 0; k < n_keys; k++)
        groups += count[k + 1] > 0;
    int32_t *gstart = order + n, *gkey = gstart + groups + 1;
    long g = 0;
    for (long k = 0; k < n_keys; k++) {
        if (count[k + 1] > 0) {
            gstart[g] = count[k];
            gkey[g++] = (int32_t)k;
        }
        count[k + 1] += count[k]; /* count[k]: first slot of key k */
    }
    gstart[groups] = (int32_t)n;
    for (long i = 0; i < n; i++)
        order[count[keys[i]]++] = (int32_t)i;
    struct {
        uint64_t dst, src, order, gstart, gkey;
        float scale;
        int32_t n_groups, d;
    } a;
    a.src = vk_in(src, (size_t)n * d * 4);
    a.order = vk_in(order, (size_t)(n + 2 * groups + 1) * 4);
    a.gstart = a.order + (uint64_t)n * 4;
    a.gkey = a.gstart + (uint64_t)(groups + 1) * 4;
    a.dst = vk_out(dst, (size_t)n_keys * d * 4);
    a.scale = scale;
    a.n_groups = vk_i32(groups);
    a.d = d;
    vk_i32(n_keys * (long)d);
    vk_dispatch("rows_scatter_add", &a, sizeof a, vk_groups(groups, 1), 1, 1);
}

/* ---- embedding and rows ---- */

void vk_embed(const nd_backend *be, float *x0, const float *emb, const int32_t *tok, long N, int d,
              float scale)
{
    (void)be;
    if (N <= 0 || d <= 0)
        return;
    long rows = max_index(tok, N) + 1;
    struct {
        uint64_t x0, emb, tok;
        float scale;
        int32_t N, d;
    } a;
    a.tok = vk_in(tok, (size_t)N * 4);
    a.emb = vk_in(emb, (size_t)rows * d * 4);
    a.x0 = vk_out(x0, (size_t)N * d * 4);
    a.scale = scale;
    a.N = vk_i32(N);
    a.d = d;
    vk_i32(N * (long)d);
    vk_i32(rows * (long)d);
    vk_dispatch("embed", &a, sizeof a, vk_groups(N * (long)d, 256), 1, 1);
}

void vk_embed_backward(const nd_backend *be, float *demb, const float *dx0, const int32_t *tok,
                       long N, int d, float scale)
{
    (void)be;
    scatter_rows(demb, dx0, tok, N, d, scale);
}

void vk_gather_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows, long n,
                    int d)
{
    (void)be;
    if (n <= 0 || d <= 0)
        return;
    long src_rows = max_index(rows, n) + 1;
    struct {
        uint64_t dst, src, rows;
        int32_t n, d;
    } a;
    a.rows = vk_in(rows, (size_t)n * 4);
    a.src = vk_in(src, (size_t)src_rows * d * 4);
    a.dst = vk_out(dst, (size_t)n * d * 4);
    a.n = vk_i32(n);
    a.d = d;
    vk_i32(n * (long)d);
    vk_i32(src_rows * (long)d);
    vk_dispatch("rows_gather", &a, sizeof a, vk_groups(n * (long)d, 256), 1, 1);
}

void vk_scatter_add_rows(const nd_backend *be, float *dst, const float *src, const int32_t *rows,
                         long n, int d)
{
    (void)be;
    scatter_rows(dst, src, rows, n, d, 1.0f); /* x * 1 is exact: plain sums */
}

/* ---- engram ---- */

/* the n-gram hash reads at most this many tokens (as the CPU's SAN_MAX_ORDER) */
#define ENGRAM_MAX_ORDER 8

void vk_engram_hash(const nd_backend *be, int32_t *idx, const int32_t *tok, const nd_layout *L,
                    const int *orders, int n_orders, int heads, int slots)
{
    vk_engram_hash_seeded(be, idx, tok, L, orders, n_orders, heads, slots, heads);
}

void vk_engram_hash_seeded(const nd_backend *be, int32_t *idx, const int32_t *tok,
                           const nd_layout *L, const int *orders, int n_orders, int heads,
                           int slots, int stride)
{
    (void)be;
    long N = L->N;
    int K = n_orders * heads, omax = 0;
    if (N <= 0 || K <= 0)
        return;
    for (int o = 0; o < n_orders; o++)
        omax = orders[o] > omax ? orders[o] : omax;
    omax = omax < ENGRAM_MAX_ORDER ? omax : ENGRAM_MAX_ORDER;
    struct {
        uint64_t idx, tok, lay, orders;
        int32_t N, n_seg, n_orders, heads, slots, omax, stride;
    } a;
    a.tok = vk_in(tok, (size_t)N * 4);
    a.orders = vk_in(orders, (size_t)n_orders * 4);
    a.lay = vk_layout(L);
    a.idx = vk_out(idx, (size_t)N * K * 4);
    a.N = vk_i32(N);
    a.n_seg = L->n_seg;
    a.n_orders = n_orders;
    a.heads = heads;
    a.slots = slots;
    a.omax = omax;
    a.stride = stride;
    vk_i32(N * (long)K);
    vk_dispatch("engram_hash", &a, sizeof a, vk_groups(N, 64), 1, 1);
}

void vk_engram_gather(const nd_backend *be, float *e, const float *tables, const int32_t *idx,
                      const nd_layout *L, const int *orders, int n_orders, int heads, int slots,
                      int sub)
{
    (void)be;
    long N = L->N;
    int K = n_orders * heads;
    if (N <= 0 || K <= 0 || sub <= 0)
        return;
    struct {
        uint64_t e, tables, idx, lay, orders;
        int32_t N, n_seg, K, heads, slots, sub;
    } a;
    a.tables = vk_in(tables, (size_t)K * slots * sub * 4);
    a.idx = vk_in(idx, (size_t)N * K * 4);
    a.orders = vk_in(orders, (size_t)n_orders * 4);
    a.lay = vk_layout(L);
    a.e = vk_out(e, (size_t)N * K * sub * 4);
    a.N = vk_i32(N);
    a.n_seg = L->n_seg;
    a.K = K;
    a.heads = heads;
    a.slots = slots;
    a.sub = sub;
    vk_i32(N * K * (long)sub);
    vk_i32((long)K * slots * sub);
    vk_dispatch("engram_gather", &a, sizeof a, vk_groups(N * K * (long)sub, 256), 1, 1);
}

void vk_engram_gather_backward(const nd_backend *be, float *dtables, const float *de,
                               const int32_t *idx, const nd_layout *L, const int *orders,
                               int n_orders, int heads, int slots, int sub)
{
    (void)be;
    long N = L->N;
    int K = n_orders * heads;
    if (!dtables || N <= 0 || K <= 0 || sub <= 0)
        return;
    vk_i32(N * K * (long)sub);
    vk_i32((long)K * slots * sub);
    size_t links = (size_t)N * K;
    /* scratch first (see scratch_dev); each dispatch below names what it
     * reads itself, as the hazard tracking is per dispatch */
    int32_t *lead = scratch_dev(2 * links * sizeof(int32_t)), *next = lead + links;

    /* 1: per table, chain the rows that hit the same table row */
    struct {
        uint64_t lead, next, idx, lay, orders;
        int32_t N, n_seg, K, heads;
    } l;
    l.idx = vk_in(idx, links * 4);
    l.orders = vk_in(orders, (size_t)n_orders * 4);
    l.lay = vk_layout(L);
    l.lead = vk_out(lead, links * 4);
    l.next = vk_out(next, links * 4);
    l.N = vk_i32(N);
    l.n_seg = L->n_seg;
    l.K = K;
    l.heads = heads;
    vk_dispatch("engram_gather_link", &l, sizeof l, vk_groups(N, 256), (uint32_t)K, 1);

    /* 2: each chain's first row adds the chain into its table row */
    struct {
        uint64_t dtables, de, idx, lead, next;
        int32_t N, K, slots, sub;
    } s;
    s.de = vk_in(de, (size_t)N * K * sub * 4);
    s.idx = vk_in(idx, links * 4);
    s.lead = vk_in(lead, links * 4);
    s.next = vk_in(next, links * 4);
    s.dtables = vk_out(dtables, (size_t)K * slots * sub * 4);
    s.N = vk_i32(N);
    s.K = K;
    s.slots = slots;
    s.sub = sub;
    vk_dispatch("engram_gather_scatter", &s, sizeof s, vk_groups(N * K * (long)sub, 256), 1, 1);
}

void vk_engram_taps(const nd_backend *be, float *v, const float *vp, const float *taps,
                    const nd_layout *L, int d, int dil)
{
    (void)be;
    long N = L->N;
    if (N <= 0 || d <= 0)
        return;
    struct {
        uint64_t v, vp, taps, lay;
        int32_t N, n_seg, d, dil;
    } a;
    a.vp = vk_in(vp, (size_t)N * d * 4);
    a.taps = vk_in(taps, (size_t)4 * d * 4);
    a.lay = vk_layout(L);
    a.v = vk_out(v, (size_t)N * d * 4);
    a.N = vk_i32(N);
    a.n_seg = L->n_seg;
    a.d = d;
    a.dil = dil;
    vk_i32(N * (long)d);
    vk_dispatch("engram_taps", &a, sizeof a, vk_groups(N * (long)d, 256), 1, 1);
}

/* rows per dtaps partial sum */
#define TAPS_CHUNK 64

void vk_engram_taps_backward(const nd_backend *be, float *dvp, float *dtaps, const float *dv,
                             const float *vp, const float *taps, const nd_layout *L, int d, int dil)
{
    (void)be;
    long N = L->N;
    if (N <= 0 || d <= 0)
        return;
    vk_i32(N * (long)d);
    /* scratch first: growing it syncs, which recycles what was staged */
    long n_chunks = (N + TAPS_CHUNK - 1) / TAPS_CHUNK, width = 4L * d;
    float *part = dtaps ? scratch_dev((size_t)n_chunks * width * sizeof(float)) : NULL;
    struct {
        uint64_t dvp, dv, taps, lay;
        int32_t N, n_seg, d, dil;
    } a;
    a.dv = vk_in(dv, (size_t)N * d * 4);
    a.taps = vk_in(taps, (size_t)4 * d * 4);
    a.lay = vk_layout(L);
    a.dvp = vk_out(dvp, (size_t)N * d * 4);
    a.N = vk_i32(N);
    a.n_seg = L->n_seg;
    a.d = d;
    a.dil = dil;
    vk_dispatch("engram_taps_dvp", &a, sizeof a, vk_groups(N * (long)d, 256), 1, 1);
    if (!dtaps)
        return;

    struct {
        uint64_t part, dv, vp, lay;
        int32_t N, n_seg, d, dil, chunk, n_chunks;
    } p;
    p.dv = vk_in(dv, (size_t)N * d * 4);
    p.vp = vk_in(vp, (size_t)N * d * 4);
    p.lay = vk_layout(L);
    p.part = vk_out(part, (size_t)n_chunks * width * 4);
    p.N = vk_i32(N);
    p.n_seg = L->n_seg;
    p.d = d;
    p.dil = dil;
    p.chunk = TAPS_CHUNK;
    p.n_chunks = vk_i32(n_chunks);
    vk_i32(n_chunks * width);
    vk_dispatch("engram_taps_dtaps", &p, sizeof p, vk_groups(n_chunks, 1), 1, 1);

    struct {
        uint64_t dst, part;
        int32_t n_chunks, width;
    } r;
    r.part = vk_in(part, (size_t)n_chunks * width * 4);
    r.dst = vk_out(dtaps, (size_t)width * 4);
    r.n_chunks = (int32_t)n_chunks;
    r.width = vk_i32(width);
    vk_dispatch("rows_reduce_add", &r, sizeof r, vk_groups(width, 256), 1, 1);
}

void vk_engram_gate(const nd_backend *be, float *bx, float *alpha, const float *u, const float *k,
                    const float *v, long N, int d, int accumulate)
{
    (void)be;
    if (N <= 0 || d <= 0)
        return;
    size_t bytes = (size_t)N * d * 4;
    struct {
        uint64_t bx, alpha, u, k, v;
        int32_t N, d, accumulate;
    } a;
    a.u = vk_in(u, bytes);
    a.k = vk_in(k, bytes);
    a.v = vk_in(v, bytes);
    a.bx = vk_out(bx, bytes);
    a.alpha = vk_out(alpha, (size_t)N * 4);
    a.N = vk_i32(N);
    a.d = d;
    a.accumulate = accumulate != 0;
    vk_i32(N * (long)d);
    vk_dispatch("engram_gate", &a, sizeof a, vk_groups(N, 1), 1, 1);
}

void vk_engram_gate_backward(const nd_backend *be, float *du, float *dk, float *dv,
                             const float *dbx, const float *u, const float *k, const float *v,
                             const float *alpha, long N, int d)
{
    (void)be;
    if (N <= 0 || d <= 0)
        return;
    size_t bytes = (size_t)N * d * 4;
    struct {
        uint64_t du, dk, dv, dbx, u, k, v, alpha;
        int32_t N, d;
    } a;
    a.dbx = vk_in(dbx, bytes);
    a.u = vk_in(u, bytes);
    a.k = vk_in(k, bytes);
    a.v = vk_in(v, bytes);
    a.alpha = vk_in(alpha, (size_t)N * 4);
    a.du = vk_out_opt(du, bytes);
    a.dk = vk_out_opt(dk, bytes);
    a.dv = vk_out_opt(dv, bytes);
    a.N = vk_i32(N);
    a.d = d;
    vk_i32(N * (long)d);
    vk_dispatch("engram_gate_backward", &a, sizeof a, vk_groups(N, 1), 1, 1);
}

/* ---- cross-entropy ---- */

void vk_cross_entropy(const nd_backend *be, float *loss, const float *logits, const int32_t *target,
                      long N, int V)
{
    (void)be;
    if (N <= 0 || V <= 0)
        return;
    struct {
        uint64_t loss, logits, target;
        int32_t N, V;
    } a;
    a.logits = vk_in(logits, (size_t)N * V * 4);
    a.target = vk_in(target, (size_t)N * 4);
    a.loss = vk_out(loss, (size_t)N * 4);
    a.N = vk_i32(N);
    a.V = V;
    vk_i32(N * (long)V);
    vk_dispatch("ce_loss", &a, sizeof a, vk_groups(N, 1), 1, 1);
}

void vk_cross_entropy_backward(const nd_backend *be, float *logits, const int32_t *target,
                               const float *weight, long N, int V)
{
    (void)be;
    if (N <= 0 || V <= 0)
        return;
    struct {
        uint64_t logits, target, weight;
        int32_t N, V;
    } a;
    a.target = vk_in(target, (size_t)N * 4);
    a.weight = vk_in_opt(weight, (size_t)N * 4);
    a.logits = vk_out(logits, (size_t)N * V * 4);
    a.N = vk_i32(N);
    a.V = V;
    vk_i32(N * (long)V);
    vk_dispatch("ce_backward", &a, sizeof a, vk_groups(N, 1), 1, 1);
}

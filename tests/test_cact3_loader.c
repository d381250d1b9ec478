/* The Needle 3 archive (tag 0x05E12A84, cactus-needle 3.x export.py) as
 * the library writes and loads it:
 *   - the 196-byte header of the tiny3b preset, field by field, against
 *     values worked out by hand from the preset (comments show the sums);
 *   - the tensor count, order (names), 64-byte alignment and zero gaps;
 *   - build -> load -> dequantise against the checkpoint: FP16 tensors to
 *     half precision, CQ matrices exactly our own CQ round trip of the
 *     source (and within the 4-bit quantiser's error), the config the
 *     loader recovers (gate, factor mode, split permutations), the
 *     quantised view (matrix views, small tensors, permutations, heads);
 *   - hostile archives: every truncation, lying sizes, shapes, header
 *     fields, permutation tables and head codes fail cleanly;
 *   - the session loader refuses this archive (it has no tokenizer) with a
 *     clear error, no crash (tests/test_session3.py runs v3 archives). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "core/fp16.h"
#include "core/status.h"
#include "engine/model_internal.h"
#include "io/cact.h"
#include "io/cact_bytes.h"
#include "io/checkpoint.h"
#include "model/cq.h"
#include "model/hada3.h"

static unsigned char *write3(const san_model *m, const pv *params, int bits, size_t *len)
{
    cact_write_opts o = {0};
    o.bits = bits;
    o.group = CQ_GROUP;
    o.kv_window = cact3_effective_kv_window(&m->cfg);
    unsigned char *buf = NULL;
    int rc = cact_write_mem(m, params, &o, &buf, len, NULL);
    CHECK_MSG(rc == 0, "%s", nd_last_error());
    return rc ? NULL : buf;
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static int make_model(const char *preset, san_model *m, pv **root)
{
    san_config c;
    if (san_config_preset(&c, preset) || san_model_create(m, &c))
        return -1;
    san_model_init_random(m, 7);
    /* move every tensor away from its initialiser so each one is checked */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < m->numel; i++) { /* + uniform noise in [-0.05, 0.05) */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        m->mem[i] += 0.1f * ((float)(x >> 40) / (float)(1u << 24) - 0.5f);
    }
    *root = ckpt_fresh_tree(m, 3); /* the model's tensors and the three probe heads */
    return *root ? 0 : -1;
}

/* ---- the header of tiny3b, by hand ---- */
static void test_header_by_hand(const unsigned char *b, size_t len)
{
    /* tiny3b: vocab 8192, d 40, H 4, G 2, L 4, qk 10, v 6, max_seq_len 256,
     * lanes 2, sliding_window 3, global_layers (0,), qkv taps 2, engram
     * site (1,), orders (2, 3), slots 64, out_vocab 8000, rope 1e5.
     * hada_n: next power of two >= 40 = 64.
     * engram heads: 40 // (2 * 128) = 0 -> 1; sub = 40 // (2 * 1) = 20;
     * tables = 2 * 1 = 2; dilation = max(2, 3) = 3.
     * kv_window: kd = 2 * 10 = 20, vd = 2 * 6 = 12, per_layer = 20 + 12 +
     * (0 + 0) * 4 = 32, per_site = 40 + 1 * 4 = 44, local = min(3, 256) = 3,
     * fixed = ((4 - 1) * 32 + 44) * 3 = 420, ctx = (12058624 - 420) // 32
     * // 32 * 32 = 376800 -> min(376800, 256) = 256 -> max(160, 256) = 256.
     * tensors: 1 + 4 * 27 + 9 + 2 + 4 * 1 + 1 = 125, heads 1 + 6 + 6 + 7 = 20:
     * 145. */
    static const uint32_t want[48] = {0x05E12A84, 145, 28, 256, 8, 8192, 8000, 40, 4,  2,  4, 10,
                                      6,          256, 64, 2,   3, 1,    0,    2,  64, 20, 2, 4,
                                      3,          0,   2,  2,   3, 0,    0,    1,  1,  0,  0, 0,
                                      0,          0,   0,  0,   0, 0,    0,    0,  0,  0,  0, 0};
    static const char *names[48] = {"tag",
                                    "num_tensors",
                                    "codebook_len",
                                    "kv_window",
                                    "kv_bits",
                                    "vocab",
                                    "out_vocab",
                                    "d_model",
                                    "num_heads",
                                    "num_kv_heads",
                                    "num_layers",
                                    "qk_head_dim",
                                    "v_head_dim",
                                    "max_seq_len",
                                    "hada_n",
                                    "mhc_lanes",
                                    "sliding_window",
                                    "global_mask_lo",
                                    "global_mask_hi",
                                    "qkv_conv_taps",
                                    "engram_slots",
                                    "engram_sub_dim",
                                    "num_engram_tables",
                                    "engram_conv_taps",
                                    "engram_conv_dilation",
                                    "engram_seed_heads",
                                    "num_engram_orders",
                                    "orders[0]",
                                    "orders[1]",
                                    "orders[2]",
                                    "orders[3]",
                                    "num_engram_sites",
                                    "sites[0]",
                                    "sites[1]",
                                    "sites[2]",
                                    "sites[3]",
                                    "sites[4]",
                                    "sites[5]",
                                    "sites[6]",
                                    "sites[7]",
                                    "sites[8]",
                                    "sites[9]",
                                    "sites[10]",
                                    "sites[11]",
                                    "sites[12]",
                                    "sites[13]",
                                    "sites[14]",
                                    "sites[15]"};
    CHECK(len > CACT3_HEADER_SIZE);
    for (int i = 0; i < 48; i++)
        CHECK_MSG(get_u32(b + 4 * i) == want[i], "header field %d (%s) = %u, want %u", i, names[i],
                  get_u32(b + 4 * i), want[i]);
    CHECK(get_f32(b + 192) == 100000.0f);
    /* the codebooks follow the 196 bytes: cb2 | cb3 | cb4 at group 128 */
    float cb[CQ_HEADER_CODEBOOK_LEN];
    CHECK(cq_header_codebooks(128, cb) == 0);
    for (int i = 0; i < CQ_HEADER_CODEBOOK_LEN; i++)
        CHECK(get_f32(b + 196 + 4 * i) == cb[i]);
}

/* ---- order and alignment ---- */
static void test_order(const cact_file *f)
{
    static const char *want[] = {
        "embedding",         "layer00.norm_in",   "layer00.q_proj",    "layer00.k_proj",
        "layer00.v_proj",    "layer00.q_taps",    "layer00.k_taps",    "layer00.v_taps",
        "layer00.q_norm",    "layer00.k_norm",    "layer00.gate_proj", "layer00.out_proj",
        "layer00.post_norm", "layer00.attn_gate", "layer00.pre_hada",  "layer00.d1",
        "layer00.d2",        "layer00.b2",        "layer00.d3",        "layer00.d4",
        "layer00.w1a",       "layer00.w1b",       "layer00.w2a",       "layer00.w2b",
        "layer00.w3a",       "layer00.w3b",       "layer00.cond_v",    "layer00.cond_u",
        "layer01.norm_in"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK_MSG(!strcmp(f->t[i].name, want[i]), "tensor %zu is %s, want %s", i, f->t[i].name,
                  want[i]);
    /* after the 4 layers (1 + 4 * 27 = 109): mHC, permutations, the engram site, final_norm, heads
     */
    static const char *tail[] = {"mhc_a_pre",
                                 "mhc_a_post",
                                 "mhc_a_res",
                                 "mhc_b_pre",
                                 "mhc_b_post",
                                 "mhc_b_res",
                                 "mhc_phi_pre",
                                 "mhc_phi_post",
                                 "mhc_phi_res",
                                 "hada_p1",
                                 "hada_p2",
                                 "engram0.tables",
                                 "engram0.key_proj",
                                 "engram0.value_proj",
                                 "engram0.taps",
                                 "final_norm",
                                 "heads.manifest",
                                 "embedding_head.probes",
                                 "embedding_head.gain",
                                 "embedding_head.query",
                                 "embedding_head.row_bias",
                                 "embedding_head.proj",
                                 "embedding_head.bias",
                                 "confidence_head.probes"};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++)
        CHECK_MSG(!strcmp(f->t[109 + i].name, tail[i]), "tensor %zu is %s, want %s", 109 + i,
                  f->t[109 + i].name, tail[i]);
    CHECK(!strcmp(f->t[f->hdr.num_tensors - 1].name, "router_head.calibration"));
    /* dtypes where 3.x fixes them */
    CHECK(f->t[0].dtype == CACT_CQ && f->t[2].dtype == CACT_CQ && f->t[5].dtype == CACT_FP16);
    CHECK(f->t[118].dtype == CACT_FP32 && f->t[119].dtype == CACT_FP32);
    CHECK(f->t[126].dtype == CACT_CQ && f->t[126].bits == CACT3_HEAD_BITS); /* embedding probes */
    /* 64-byte aligned, in order, gaps zero, the last blob ends the file */
    uint64_t pos = CACT3_HEADER_SIZE + 28 * 4 + (uint64_t)f->hdr.num_tensors * CACT_REC_SIZE;
    for (uint32_t i = 0; i < f->hdr.num_tensors; i++) {
        uint64_t al = (pos + 63) & ~(uint64_t)63;
        CHECK_MSG(f->t[i].offset == al, "tensor %u at %llu, want %llu", i,
                  (unsigned long long)f->t[i].offset, (unsigned long long)al);
        for (uint64_t k = pos; k < al; k++)
            CHECK(f->data[k] == 0);
        pos = f->t[i].offset + f->t[i].nbytes;
    }
    CHECK(pos == f->len);
}

static const san_tensor *find_like(const san_model *m, const char *name)
{
    return san_model_find(m, name);
}

/* ---- round trip ---- */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t k = 0; k < n; k++) {
        double e = (double)a[k] - b[k];
        num += e * e;
        den += (double)b[k] * b[k];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* a float32 array of the params tree */
static const float *param_f32(const pv *params, const char *path, size_t n)
{
    const pv *a = ckpt_tree_get(params, path);
    if (!a || a->kind != PV_NDARRAY || a->u.nd.dtype != ND_F32 || (size_t)pv_nd_numel(a) != n)
        return NULL;
    return a->u.nd.data;
}

static void test_round_trip(const san_model *m, const pv *params, const cact_file *f, int banks)
{
    san_model r;
    int rc = nd_cact3_to_model(f, &r);
    CHECK_MSG(rc == 0, "%s", nd_last_error());
    if (rc)
        return;
    const san_config *a = &m->cfg, *b = &r.cfg;
    CHECK(b->generation == 3 && b->d_model == a->d_model && b->num_layers == a->num_layers);
    CHECK(b->qk_head_dim == a->qk_head_dim && b->v_head_dim == a->v_head_dim);
    CHECK(b->attention_gate == a->attention_gate);
    CHECK(b->hada_factor_mode == a->hada_factor_mode);
    CHECK((b->n_ladder_widths > 0) == (a->n_ladder_widths > 0));
    CHECK(b->out_vocab == a->out_vocab && b->sliding_window == a->sliding_window);
    CHECK(b->n_global == a->n_global && b->global_layers[0] == a->global_layers[0]);
    CHECK(b->qkv_conv_taps == a->qkv_conv_taps && b->engram_seed_heads == a->engram_seed_heads);
    CHECK(b->n_sites == a->n_sites && b->engram_slots == a->engram_slots);
    CHECK(b->n_cla == 0 && b->n_bank_ids == 0); /* the header cannot say them */
    CHECK(b->kv_window == cact3_effective_kv_window(a));
    double worst = 0;
    int matrices = 0, smalls = 0;
    for (int i = 0; i < r.n_tensors; i++) {
        const san_tensor *t = &r.tensors[i];
        const float *got = r.mem + t->offset;
        const float *src = NULL;
        const san_tensor *s = find_like(m, t->name);
        if (s)
            src = m->mem + s->offset;
        else if (banks && !strncmp(t->name, "engrams_", 8)) {
            /* engrams_<s>/x of the loaded model: the banked source's reader / bank */
            int site = atoi(t->name + 8);
            const char *leaf = strchr(t->name, '/') + 1;
            if (!strcmp(leaf, "embedding")) {
                src = m->w.eng[site].table;
            } else {
                char nm[96];
                snprintf(nm, sizeof nm, "engram_readers_%d/%s", site, leaf);
                s = san_model_find(m, nm);
                src = s ? m->mem + s->offset : NULL;
            }
        }
        CHECK_MSG(src != NULL, "loaded tensor %s has no source", t->name);
        if (!src)
            continue;
        size_t n = t->numel;
        int matrix = strstr(t->name, "/kernel") || strstr(t->name, "embedding") ||
                     strstr(t->name, "mhc_phi");
        if (matrix) {
            double rel = rel_l2(got, src, n);
            if (rel > worst)
                worst = rel;
            CHECK_MSG(rel < 0.15, "%s: relative error %.3f after 4-bit CQ", t->name, rel);
            matrices++;
        } else {
            int bad = 0;
            for (size_t k = 0; k < n && !bad; k++)
                bad = fabsf(got[k] - src[k]) > fabsf(src[k]) * (1.0f / 2048) + 6e-8f;
            CHECK_MSG(!bad, "%s: not the checkpoint to half precision", t->name);
            smalls++;
        }
    }
    CHECK(matrices > 0 && smalls > 0);
    printf("  round trip: %d matrices (worst relative error %.4f), %d small tensors\n", matrices,
           worst, smalls);
    /* each CQ matrix is exactly our own CQ round trip of the source: q_proj of layer 1 */
    const san_dims *D = &m->dims;
    size_t qd = (size_t)D->q_dim, d = (size_t)D->d;
    float *wt = malloc(qd * d * sizeof *wt), *back = malloc(qd * d * sizeof *back);
    size_t bl = cq_blob_bytes((int64_t)qd, (int64_t)d, 4, 128);
    unsigned char *blob = malloc(bl);
    if (wt && back && blob) {
        const float *k = m->w.wq + qd * d; /* layer 1 kernel (d, qd) */
        for (size_t i = 0; i < d; i++)
            for (size_t o = 0; o < qd; o++)
                wt[o * d + i] = k[i * qd + o];
        CHECK(cq_quantize(wt, (int64_t)qd, (int64_t)d, 4, 128, blob) == 0);
        CHECK(cq_dequantize(blob, bl, (int64_t)qd, (int64_t)d, 4, 128, back) == 0);
        const float *g = r.w.wq + qd * d;
        int same = 1;
        for (size_t i = 0; i < d && same; i++)
            for (size_t o = 0; o < qd && same; o++)
                same = g[i * qd + o] == back[o * d + i];
        CHECK_MSG(same, "layer 1 q_proj is not the CQ round trip of the checkpoint's");
    }
    free(wt);
    free(back);
    free(blob);

    /* the quantised view: same small tensors, matrix views, permutations, heads */
    san_model s;
    nd_qweights3 q;
    rc = nd_cact3_to_qmodel(f, &s, &q);
    CHECK_MSG(rc == 0, "%s", nd_last_error());
    if (!rc) {
        for (int i = 0; i < s.n_tensors; i++) {
            const san_tensor *t = &s.tensors[i];
            if (!*(float **)((char *)&s.w + t->slot))
                continue; /* a matrix: in the archive */
            const san_tensor *u = san_model_find(&r, t->name);
            CHECK(u && !memcmp(s.mem + t->offset, r.mem + u->offset, t->numel * sizeof(float)));
        }
        CHECK(q.q.emb.rows == D->V && q.q.emb.in == D->d);
        for (int l = 0; l < D->L; l++) {
            CHECK(q.q.layer[l].wq.rows == D->q_dim && q.q.layer[l].wq.in == D->d);
            CHECK(q.q.layer[l].wk.rows == D->k_dim && q.q.layer[l].wv.rows == D->v_dim);
            CHECK(q.q.layer[l].wgate.rows == D->gate_dim && q.q.layer[l].wout.in == D->o_dim);
        }
        CHECK(q.q.phi_res.rows == D->L * D->n * D->n && q.q.phi_res.in == D->n * D->d);
        CHECK(q.q.eng[0].table.rows == D->eng_tables * m->cfg.engram_slots);
        san_hada3_geom g;
        if (!san_hada3_geom_init(&g, D->d, m->cfg.hada_factor_mode == SAN_HADA_BLOCK_UNTIED,
                                 m->cfg.n_ladder_widths > 0)) {
            CHECK(!memcmp(g.perm1, q.perm1, (size_t)D->hada_n * 4));
            CHECK(!memcmp(g.perm2, q.perm2, (size_t)D->hada_n * 4));
            san_hada3_geom_free(&g);
        }
        CHECK(q.n_heads == 3 && q.head[0].code == 1 && q.head[1].code == 2 && q.head[2].code == 3);
        CHECK(q.head[0].k == m->cfg.embedding_probes && q.head[0].q == m->cfg.embedding_queries &&
              q.head[0].out == m->cfg.embedding_dim);
        CHECK(q.head[1].out == 1 && q.head[2].out == 3 && q.head[2].k == m->cfg.router_probes);
        CHECK(q.head[0].bias[0] == 0.0f); /* the embedding head's proj has no bias */
        /* the float head matrices (model/probe3.h's layouts) against the checkpoint */
        static const char *hk[3] = {"embedding_head", "confidence_head", "router_head"};
        for (int h = 0; h < 3; h++) {
            const nd_qhead3 *hd = &q.head[h];
            size_t L1 = (size_t)D->L + 1, dd = (size_t)D->d, k = (size_t)hd->k, qn = (size_t)hd->q,
                   out = (size_t)hd->out;
            char path[64];
            snprintf(path, sizeof path, "%s/probes", hk[h]);
            const float *sp = param_f32(params, path, L1 * k * dd);
            snprintf(path, sizeof path, "%s/query", hk[h]);
            const float *sq = param_f32(params, path, qn * dd);
            snprintf(path, sizeof path, "%s/proj/kernel", hk[h]);
            const float *sk = param_f32(params, path, qn * dd * out);
            CHECK(sp && sq && sk && hd->probes_f && hd->query_f && hd->proj_f);
            if (sp && sq && sk && hd->probes_f && hd->query_f && hd->proj_f) {
                double e1 = rel_l2(hd->probes_f, sp, L1 * k * dd),
                       e2 = rel_l2(hd->query_f, sq, qn * dd),
                       e3 = rel_l2(hd->proj_f, sk, qn * dd * out);
                CHECK_MSG(e1 < 0.15 && e2 < 0.15 && e3 < 0.15,
                          "%s: probes %.3f query %.3f proj %.3f relative error", hk[h], e1, e2, e3);
            }
        }
        CHECK(q.head[2].calibration[0] == nd_half_to_float(nd_float_to_half(0.9f)) &&
              q.head[2].calibration[1] == 0.0f &&
              q.head[2].calibration[2] == nd_half_to_float(nd_float_to_half(0.6f)));
        san_model_free(&s);
        nd_qweights3_free(&q);
    }
    san_model_free(&r);
}

/* the archive must be refused by the parser or the loader, cleanly */
static int refused(const unsigned char *b, size_t len)
{
    cact_file f;
    if (cact_parse(b, len, &f))
        return 1;
    san_model m;
    nd_qweights3 q;
    int rc = nd_cact3_to_qmodel(&f, &m, &q);
    if (!rc) {
        san_model_free(&m);
        nd_qweights3_free(&q);
        rc = nd_cact3_to_model(&f, &m);
        if (!rc)
            san_model_free(&m);
    }
    cact_free(&f);
    return rc != 0;
}

static uint32_t rec_at(uint32_t i)
{
    return CACT3_HEADER_SIZE + 28 * 4 + i * CACT_REC_SIZE;
}

static void test_hostile(const unsigned char *good, size_t len, const cact_file *f)
{
    unsigned char *b = malloc(len);
    if (!b)
        return;
    CHECK(!refused(good, len));
    /* every truncation (a stride through the blobs, every byte of the head) */
    int bad = 0;
    size_t head = rec_at(f->hdr.num_tensors);
    for (size_t n = 0; n < len; n += n < head + 64 ? 1 : 97)
        bad += !refused(good, n);
    CHECK_MSG(bad == 0, "%d truncated archives were accepted", bad);
#define MUTATE(what, stmt, frag)                                                                   \
    do {                                                                                           \
        memcpy(b, good, len);                                                                      \
        stmt;                                                                                      \
        CHECK_MSG(refused(b, len), "%s was accepted", what);                                       \
        CHECK_MSG(strstr(nd_last_error(), frag) != NULL, "%s: message '%s' lacks '%s'", what,      \
                  nd_last_error(), frag);                                                          \
    } while (0)
    int qp = cact_find(f, "layer01.q_proj"), cv = cact_find(f, "layer00.cond_v");
    int p1 = cact_find(f, "hada_p1"), man = cact_find(f, "heads.manifest");
    CHECK(qp > 0 && cv > 0 && p1 > 0 && man > 0);
    MUTATE("a CQ blob size that lies", put64(b + rec_at((uint32_t)qp) + 28, f->t[qp].nbytes + 2),
           "bytes");
    MUTATE("a blob past the end", put64(b + rec_at((uint32_t)qp) + 20, len - 8), "outside");
    MUTATE("an offset that wraps", put64(b + rec_at((uint32_t)qp) + 20, ~(uint64_t)0 - 4),
           "outside");
    MUTATE("cond_v transposed (same size)",
           (put32(b + rec_at((uint32_t)cv) + 4, 8), put32(b + rec_at((uint32_t)cv) + 8, 40)),
           "cond_v");
    MUTATE("num_tensors 2^31", put32(b + 4, 0x80000000u), "directory");
    MUTATE("num_layers one more", put32(b + 40, 5), "tensor");
    MUTATE("num_layers zero", put32(b + 40, 0), "num_layers");
    MUTATE("d_model huge", put32(b + 28, 0xFFFFFFFFu), "d_model");
    MUTATE("qk_head_dim odd", put32(b + 44, 9), "qk_head_dim");
    MUTATE("a global layer past num_layers", put32(b + 68, 1u << 9), "global_mask");
    MUTATE("hada_n wrong", put32(b + 56, 128), "hada_n");
    MUTATE("17 engram sites", put32(b + 124, 17), "sites");
    MUTATE("out_vocab past vocab", put32(b + 24, 9000), "out_vocab");
    MUTATE("engram tables not a multiple of orders", put32(b + 88, 3), "engram tables");
    MUTATE("a permutation table not 3.x's",
           (put32(b + f->t[p1].offset, get_u32(good + f->t[p1].offset + 4)),
            put32(b + f->t[p1].offset + 4, get_u32(good + f->t[p1].offset))),
           "permutation");
    MUTATE("a head code 7", put32(b + f->t[man].offset, 0x4700u /* fp16 7.0 */), "head code");
    MUTATE("a manifest of two heads before three heads' tensors",
           (put32(b + rec_at((uint32_t)man) + 4, 2), put64(b + rec_at((uint32_t)man) + 28, 4)),
           "no head uses");
    MUTATE("an unknown dtype", b[rec_at(3)] = 9, "dtype");
    free(b);
}

int main(void)
{
    san_model m;
    pv *root = NULL;
    CHECK(make_model("tiny3b", &m, &root) == 0);
    const pv *params = root ? pv_dict_get(root, "params") : NULL;
    size_t len = 0;
    unsigned char *buf = root ? write3(&m, params, 4, &len) : NULL;
    if (buf) {
        test_header_by_hand(buf, len);
        cact_file f;
        int rc = cact_parse(buf, len, &f);
        CHECK_MSG(rc == 0, "%s", nd_last_error());
        if (!rc) {
            CHECK(f.generation == 3 && f.hdr.num_tensors == 145 && f.hdr.vocab == 8192);
            test_order(&f);
            test_round_trip(&m, params, &f, 0);
            test_hostile(buf, len, &f);
            /* the Needle 2 loader refuses it by name */
            san_config c;
            CHECK(nd_cact_config(&f, &c) == ND_EUNSUPPORTED);
            cact_free(&f);
        }
        /* the engine loads v3 archives (tests/test_session3.py); this one
         * has no tokenizer, which the session loader refuses by name */
        needle_model *M = needle_model_load_buffer(buf, len);
        CHECK(M == NULL);
        CHECK_MSG(strstr(nd_last_error(), "tokenizer") != NULL, "%s", nd_last_error());
        needle_model_free(M);
        free(buf);
    }
    /* widths: 3.x writes 4; 2 and 3 use the header's cb2 / cb3, heads stay 4 */
    for (int bits = 2; bits <= 3 && root; bits++) {
        unsigned char *b = write3(&m, params, bits, &len);
        cact_file f;
        if (b && !cact_parse(b, len, &f)) {
            CHECK(f.t[0].bits == (uint32_t)bits &&
                  f.t[cact_find(&f, "mhc_phi_res")].bits == (uint32_t)bits);
            CHECK(f.t[cact_find(&f, "router_head.proj")].bits == 4);
            cact_free(&f);
        } else {
            CHECK(!"a 2/3-bit v3 archive parses");
        }
        free(b);
    }
    {
        cact_write_opts o = {0};
        o.bits = 5; /* ternary: not a 3.x width */
        unsigned char *b = NULL;
        CHECK(root && cact_write_mem(&m, params, &o, &b, &len, NULL) == ND_EARG);
        free(b);
    }
    pv_decref(root);
    san_model_free(&m);

    /* tiny3: engram banks (each site its bank's tables), split permutations,
     * CLA (not in the header), elementwise gate, shared factors */
    if (make_model("tiny3", &m, &root) == 0) {
        m.cfg.n_ladder_widths = 1; /* hada_split: the loader must find it from the tables */
        m.cfg.ladder_widths[0] = m.cfg.d_model / 2;
        buf = write3(&m, pv_dict_get(root, "params"), 4, &len);
        cact_file f;
        if (buf && !cact_parse(buf, len, &f)) {
            test_round_trip(&m, pv_dict_get(root, "params"), &f, 1);
            cact_free(&f);
        }
        free(buf);
        pv_decref(root);
        san_model_free(&m);
    } else {
        CHECK(!"tiny3 model");
    }
    return tu_finish("test_cact3_loader");
}

/* Needle 3 configs, parameter table and checkpoint tree: 3.x's
 * TransformerConfig semantics (missing keys mean "feature off", its
 * validation rules, JSON lists for tuples), the generation rule, the
 * presets' shapes and tensor names, initialisers, and the checkpoint
 * round trip with the probe heads carried along. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/checkpoint.h"
#include "model/params.h"
#include "testutil.h"

static pv *ints(const int *v, int n, int list)
{
    pv *t = list ? pv_list() : pv_tuple();
    for (int i = 0; i < n; i++)
        pv_append(t, pv_int(v[i]));
    return t;
}

/* a small 3.x config dict that names only what it sets */
static pv *small3(void)
{
    pv *d = pv_dict();
    pv_dict_set(d, "vocab_size", pv_int(300));
    pv_dict_set(d, "d_model", pv_int(48));
    pv_dict_set(d, "num_heads", pv_int(4));
    pv_dict_set(d, "num_kv_heads", pv_int(2));
    pv_dict_set(d, "num_layers", pv_int(6));
    pv_dict_set(d, "qk_head_dim", pv_int(8));
    return d;
}

/* from_pv must fail and its message name `key` */
static void expect_error(pv *d, const char *key, const char *what)
{
    san_config c;
    int rc = san_config_from_pv(&c, d);
    CHECK_MSG(rc != ND_OK, "%s: accepted", what);
    if (rc != ND_OK)
        CHECK_MSG(strstr(nd_last_error(), key) != NULL, "%s: error '%s' does not name %s", what,
                  nd_last_error(), key);
    pv_decref(d);
}

static void test_semantics(void)
{
    san_config c;
    /* missing 3.x keys mean "off"; other missing keys take 3.x's defaults */
    pv *d = small3();
    CHECK(san_config_generation(d) == 3);
    CHECK(san_config_from_pv(&c, d) == ND_OK);
    CHECK(c.generation == 3);
    CHECK(c.qk_head_dim == 8 && c.v_head_dim == 0);
    CHECK(c.sliding_window == 0 && c.n_global == 0 && c.qkv_conv_taps == 0);
    CHECK(c.out_vocab == 0 && c.engram_seed_heads == 0 && c.n_bank_ids == 0 && c.n_cla == 0);
    CHECK(c.attention_gate == SAN_GATE_ELEMENTWISE && c.hada_factor_mode == SAN_HADA_SHARED);
    CHECK(c.engram_slots == 18432 && c.mhc_lanes == 4 && c.max_seq_len == 4096);
    /* default engram layers (3,7,11,15,19) cut to the depth */
    CHECK(c.n_sites == 1 && c.engram_layers[0] == 3);
    san_dims D;
    CHECK(san_config_dims(&c, &D) == ND_OK);
    CHECK(D.hd == 8 && D.v_hd == 12 && D.q_dim == 32 && D.k_dim == 16 && D.v_dim == 24);
    CHECK(D.o_dim == 48 && D.gate_dim == 48 && D.V_out == 300);
    CHECK(D.hada_n == 64 && D.hada_ba == 8 && D.hada_bb == 8);
    /* attn_dim is not a 3.x field: from_saved drops it */
    pv_dict_set(d, "attn_dim", pv_int(16));
    CHECK(san_config_from_pv(&c, d) == ND_OK && san_config_dims(&c, &D) == ND_OK && D.hd == 8);
    /* JSON lists where Python wrote tuples */
    int gl[2] = {1, 4}, pair0[2] = {2, 3}, bank[2] = {0, 0}, el[2] = {0, 5};
    pv_dict_set(d, "global_layers", ints(gl, 2, 1));
    pv_dict_set(d, "engram_layers", ints(el, 2, 1));
    pv_dict_set(d, "engram_bank_ids", ints(bank, 2, 1));
    pv *pairs = pv_list();
    pv_append(pairs, ints(pair0, 2, 1));
    pv_dict_set(d, "cla_pairs", pairs);
    pv_dict_set(d, "sliding_window", pv_int(16));
    pv_dict_set(d, "attention_gate", pv_str("headwise"));
    pv_dict_set(d, "hada_factor_mode", pv_str("block_untied"));
    pv_dict_set(d, "out_vocab", pv_int(256));
    CHECK(san_config_from_pv(&c, d) == ND_OK);
    CHECK(c.n_global == 2 && c.global_layers[1] == 4 && c.n_cla == 1 && c.cla_pairs[0][1] == 3);
    CHECK(c.n_sites == 2 && c.n_bank_ids == 2);
    CHECK(san_layer_is_local(&c, 0) && !san_layer_is_local(&c, 1) && !san_layer_is_local(&c, 4));
    CHECK(san_cla_producer(&c, 3) == 2 && san_cla_producer(&c, 2) == -1);
    CHECK(san_config_dims(&c, &D) == ND_OK && D.gate_dim == 4 && D.V_out == 256 && D.n_banks == 1);
    /* the written dict reads back the same */
    pv *back = san_config_to_pv(&c);
    san_config c2;
    CHECK(san_config_from_pv(&c2, back) == ND_OK);
    CHECK(c2.generation == 3 && c2.n_cla == 1 && c2.cla_pairs[0][0] == 2 &&
          c2.attention_gate == SAN_GATE_HEADWISE && c2.hada_factor_mode == SAN_HADA_BLOCK_UNTIED &&
          c2.out_vocab == 256 && c2.sliding_window == 16 && c2.n_global == 2 &&
          c2.engram_bank_ids[1] == 0 && c2.qk_head_dim == 8);
    pv_decref(back);
    pv_decref(d);

    /* a Needle 2 config stays Needle 2 */
    san_config_preset(&c, "needle2");
    pv *v2 = san_config_to_pv(&c);
    CHECK(san_config_generation(v2) == 2);
    CHECK(san_config_from_pv(&c2, v2) == ND_OK && c2.generation == 2 && c2.attn_dim == 512);
    pv_decref(v2);

    /* 3.x's validation rules, errors naming the key */
    d = small3();
    pv_dict_set(d, "attention_gate", pv_str("sigmoid"));
    expect_error(d, "attention_gate", "attention_gate value");
    d = small3();
    pv_dict_set(d, "hada_factor_mode", pv_str("tied"));
    expect_error(d, "hada_factor_mode", "hada_factor_mode value");
    d = small3();
    pv_dict_set(d, "engram_bank_ids", ints(bank, 2, 0)); /* one site */
    expect_error(d, "engram_bank_ids", "bank ids per site");
    d = small3();
    int b2[2] = {0, 2};
    pv_dict_set(d, "engram_layers", ints(el, 2, 0));
    pv_dict_set(d, "engram_bank_ids", ints(b2, 2, 0));
    expect_error(d, "engram_bank_ids", "bank ids contiguous");
    int bad[][2] = {{2, 4}, {5, 6}, {-1, 0}};
    for (int i = 0; i < 3; i++) {
        d = small3();
        pairs = pv_tuple();
        pv_append(pairs, ints(bad[i], 2, 0));
        pv_dict_set(d, "cla_pairs", pairs);
        expect_error(d, "cla_pairs", "cla pair not adjacent / outside depth");
    }
    d = small3();
    int p1[2] = {1, 2}, p2[2] = {2, 3};
    pairs = pv_tuple();
    pv_append(pairs, ints(p1, 2, 0));
    pv_append(pairs, ints(p2, 2, 0));
    pv_dict_set(d, "cla_pairs", pairs);
    expect_error(d, "cla_pairs", "cla layer reused");
    d = small3();
    int g1[1] = {2};
    pairs = pv_tuple();
    pv_append(pairs, ints(p2, 2, 0));
    pv_dict_set(d, "cla_pairs", pairs);
    pv_dict_set(d, "global_layers", ints(g1, 1, 0));
    expect_error(d, "cla_pairs", "cla pair mixing local and global");
    d = small3();
    int three[3] = {1, 2, 3};
    pairs = pv_tuple();
    pv_append(pairs, ints(three, 3, 0));
    pv_dict_set(d, "cla_pairs", pairs);
    expect_error(d, "cla_pairs", "cla triple");
    d = small3();
    pv_dict_set(d, "qk_head_dim", pv_int(7));
    CHECK(san_config_from_pv(&c, d) == ND_OK);
    CHECK_MSG(san_config_dims(&c, &D) != ND_OK && strstr(nd_last_error(), "qk_head_dim"),
              "odd qk head dim accepted");
    pv_decref(d);
}

static void test_presets(void)
{
    san_model m;
    san_config c;
    /* the released shape */
    CHECK(san_config_preset(&c, "needle3") == ND_OK);
    CHECK(san_model_layout(&m, &c) == ND_OK);
    const san_dims *D = &m.dims;
    CHECK(D->hd == 48 && D->v_hd == 64 && D->q_dim == 576 && D->k_dim == 96 && D->v_dim == 128);
    CHECK(D->hada_n == 1024 && D->hada_ba == 32 && D->hada_bb == 32 && c.max_seq_len == 8192);
    size_t extra = 0;
    san_tensor ex[32];
    int ne = san_model_extra_tensors(&m, ex, 32);
    CHECK(ne == 19); /* 7 embedding_head tensors, 6 each for confidence and router */
    for (int i = 0; i < ne; i++)
        extra += ex[i].numel;
    /* upstream says about 121M for needle3.safetensors; the defaults give
     * 127.9M (five engram tables of 14.2M each) */
    double total = (double)(m.numel + extra) / 1e6;
    printf("needle3: %.2fM parameters (%d tensors + %d head tensors)\n", total, m.n_tensors, ne);
    CHECK(total > 110 && total < 135);
    const san_tensor *t = san_model_find(&m, "stack/layers/block/self_attn/q_taps");
    CHECK(t && t->ndim == 3 && t->shape[0] == 20 && t->shape[1] == 3 && t->shape[2] == 576);
    t = san_model_find(&m, "stack/layers/block/hadamard_mlp/w2b");
    CHECK(t && t->ndim == 3 && t->shape[1] == 32 && t->shape[2] == 32);
    CHECK(san_model_find(&m, "engrams_4/embedding") && !san_model_find(&m, "engrams_5/embedding"));
    free(m.tensors);

    /* tiny3: banks, readers, conv taps */
    CHECK(san_config_preset(&c, "tiny3") == ND_OK);
    CHECK(san_model_create(&m, &c) == ND_OK);
    CHECK(san_model_find(&m, "engram_banks_0/embedding") != NULL);
    CHECK(san_model_find(&m, "engram_banks_1/embedding") == NULL);
    CHECK(san_model_find(&m, "engram_readers_1/value_proj/kernel") != NULL);
    CHECK(san_model_find(&m, "engrams_0/embedding") == NULL);
    CHECK(m.w.eng[0].table == m.w.bank[0] && m.w.eng[1].table == m.w.bank[0]);
    san_model_init_random(&m, 3);
    /* Walsh factors are orthonormal, taps an identity conv, d4 0.02 */
    t = san_model_find(&m, "stack/layers/block/hadamard_mlp/w1a");
    const float *w = m.mem + t->offset + t->shape[1] * t->shape[2]; /* layer 1 */
    int k = (int)t->shape[1];
    double err = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            double s = 0;
            for (int x = 0; x < k; x++)
                s += (double)w[i * k + x] * w[j * k + x];
            err = fmax(err, fabs(s - (i == j)));
        }
    CHECK_MSG(err < 1e-6, "Walsh factor not orthonormal (%g)", err);
    CHECK(w[0] > 0 && fabsf(w[1] + w[k + 1]) < 1e-7f); /* H[0][1] = -H[1][1]... of Sylvester */
    t = san_model_find(&m, "stack/layers/block/self_attn/v_taps");
    const float *tp = m.mem + t->offset + t->shape[1] * t->shape[2] * 2; /* layer 2 */
    CHECK(tp[0] == 1.0f && tp[t->shape[2] - 1] == 1.0f && tp[t->shape[2]] == 0.0f);
    CHECK(m.w.d4[5] == 0.02f && m.w.d3[5] == 1.0f && m.w.cond_u[7] == 0.0f);

    /* the checkpoint tree: a fresh one has the probe heads; loading keeps
     * them beside the model, and the weights come back bit-identical */
    pv *tree = ckpt_fresh_tree(&m, 3);
    CHECK(tree != NULL);
    const pv *params = pv_dict_get(tree, "params");
    const pv *probes = ckpt_tree_get(params, "router_head/proj/kernel");
    CHECK(probes && probes->kind == PV_NDARRAY && probes->u.nd.shape[1] == 3);
    CHECK(ckpt_tree_get(params, "embedding_head/log_temp") != NULL);
    CHECK(ckpt_tree_get(params, "mtp_block/attn_gate") == NULL);
    san_model m2;
    CHECK(ckpt_from_tree(tree, "tiny3 tree", &m2) == ND_OK);
    CHECK(m2.cfg.generation == 3 && m2.numel == m.numel);
    CHECK(memcmp(m2.mem, m.mem, m.numel * sizeof(float)) == 0);
    pv *again = ckpt_to_tree(&m2, tree);
    CHECK(ckpt_tree_get(pv_dict_get(again, "params"), "confidence_head/row_bias") != NULL);
    pv_decref(again);
    /* a checkpoint with 3.x tensors is Needle 3 even with an empty config */
    pv_dict_set(tree, "config", pv_dict());
    san_model m3;
    int rc = ckpt_from_tree(tree, "tiny3 tree without config", &m3);
    CHECK_MSG(rc != ND_OK, "a tree whose config does not match its tensors loaded");
    if (rc == ND_OK)
        san_model_free(&m3);
    san_model_free(&m2);
    pv_decref(tree);
    san_model_free(&m);

    /* tiny3b: headwise gate, block_untied factors, out_vocab */
    CHECK(san_config_preset(&c, "tiny3b") == ND_OK);
    CHECK(san_model_layout(&m, &c) == ND_OK);
    t = san_model_find(&m, "stack/layers/block/self_attn/gate_proj/kernel");
    CHECK(t && t->shape[2] == 4);
    t = san_model_find(&m, "stack/layers/block/hadamard_mlp/w3a");
    CHECK(t && t->ndim == 4 && t->shape[1] == m.dims.hada_bb && t->shape[2] == m.dims.hada_ba);
    t = san_model_find(&m, "stack/layers/block/self_attn/out_proj/kernel");
    CHECK(t && t->shape[1] == 4 * 6 && t->shape[2] == 40);
    CHECK(m.dims.V_out == 8000 && san_model_find(&m, "engrams_0/taps"));
    free(m.tensors);
}

int main(void)
{
    test_semantics();
    test_presets();
    return tu_finish("test_config3");
}

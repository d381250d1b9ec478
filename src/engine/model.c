/* Loading a .cact into a needle_model (quantised or float path), the
 * vocabulary trie and chat markers the decoder needs, and the model's
 * accessors. Sessions are session.c. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "core/status.h"
#include "core/tuning.h"
#include "engine/model_internal.h"
#include "text/render.h"

int nd_piece_bytes(const nd_tokenizer *t, int id, unsigned char *out, int *len)
{
    int ty = nd_tokenizer_type(t, id);
    size_t pl;
    const char *p = nd_tokenizer_piece(t, id, &pl);
    *len = 0;
    if (!p)
        return 0;
    if (ty == ND_SPM_BYTE) {
        unsigned v;
        if (pl == 6 && sscanf(p, "<0x%2X>", &v) == 1) {
            out[0] = (unsigned char)v;
            *len = 1;
            return 1;
        }
        return 0;
    }
    if (ty != ND_SPM_NORMAL)
        return 0;
    int n = 0;
    for (size_t i = 0; i < pl; i++) {
        if (n >= PIECE_MAX)
            return 0;
        if (i + 2 < pl && (unsigned char)p[i] == 0xE2 && (unsigned char)p[i + 1] == 0x96 &&
            (unsigned char)p[i + 2] == 0x81) {
            out[n++] = ' ';
            i += 2;
        } else {
            out[n++] = (unsigned char)p[i];
        }
    }
    *len = n;
    return n > 0;
}

int nd_model_build_trie(needle_model *M)
{
    int V = M->m.dims.V;
    int cap = 4 * V + 1;
    M->trie = malloc((size_t)cap * sizeof *M->trie);
    M->tok_next = malloc((size_t)V * sizeof *M->tok_next);
    M->reason_ok = calloc((size_t)V, 1);
    if (!M->trie || !M->tok_next || !M->reason_ok)
        return nd_error(ND_ENOMEM, "out of memory");
    M->n_trie = 1;
    M->trie[0] = (trie_node){-1, -1, -1, 0};
    unsigned char b[PIECE_MAX];
    for (int id = 0; id < V; id++) {
        M->tok_next[id] = -1;
        int len;
        if (!nd_piece_bytes(M->tok, id, b, &len))
            continue;
        M->reason_ok[id] = 1;
        int node = 0;
        for (int i = 0; i < len; i++) {
            int c = M->trie[node].child;
            while (c >= 0 && M->trie[c].byte != b[i])
                c = M->trie[c].sibling;
            if (c < 0) {
                if (M->n_trie == cap) {
                    cap *= 2;
                    trie_node *t = realloc(M->trie, (size_t)cap * sizeof *t);
                    if (!t)
                        return nd_error(ND_ENOMEM, "out of memory");
                    M->trie = t;
                }
                c = M->n_trie++;
                M->trie[c] = (trie_node){-1, M->trie[node].child, -1, b[i]};
                M->trie[node].child = c;
            }
            node = c;
        }
        M->tok_next[id] = M->trie[node].tok;
        M->trie[node].tok = id;
    }
    return ND_OK;
}

static int marker(needle_model *M, const char *s, int *id)
{
    *id = nd_tokenizer_piece_to_id(M->tok, s, strlen(s));
    if (*id < 0 || *id == nd_tokenizer_unk_id(M->tok))
        return nd_error(ND_EFORMAT, "tokenizer has no %s marker", s);
    return ND_OK;
}

/* quant: the model takes f over (its matrices stay in the archive) */
static needle_model *load_parsed(cact_file *f, int quant)
{
    needle_model *M = calloc(1, sizeof *M);
    if (!M) {
        nd_error(ND_ENOMEM, "out of memory");
        cact_free(f);
        return NULL;
    }
    nd_prefix_cache_init(&M->pc);
    M->gen = f->generation == 3 ? 3 : 2;
    int rc;
    if (M->gen == 3) {
        /* quantised path: the model reads its matrices from the archive */
        if (quant) {
            M->arch = *f;
            memset(f, 0, sizeof *f);
            f = &M->arch;
        }
        M->quant = quant;
        rc = nd_cact3_to_qmodel(f, &M->m, &M->qw3);
        if (!rc && !quant) {
            /* float path: the dequantised model; of the quantised view
             * only the probe heads' float copies are kept */
            san_model_free(&M->m);
            nd_qweights_free(&M->qw3.q);
            memset(&M->qw3.q, 0, sizeof M->qw3.q);
            for (int i = 0; i < 3; i++) {
                memset(&M->qw3.head[i].probes, 0, sizeof M->qw3.head[i].probes);
                memset(&M->qw3.head[i].query, 0, sizeof M->qw3.head[i].query);
                memset(&M->qw3.head[i].proj, 0, sizeof M->qw3.head[i].proj);
            }
            rc = nd_cact3_to_model(f, &M->m);
        }
        if (rc) {
            nd_qweights3_free(&M->qw3);
            cact_free(&M->arch);
            free(M);
            return NULL;
        }
        M->kv_window = (int)f->h3.kv_window;
        M->be = nd_backend_cpu(0);
    } else {
        rc = quant ? nd_cact_to_qmodel(f, &M->m, &M->qw) : nd_cact_to_model(f, &M->m);
        if (quant) {
            M->arch = *f;
            M->quant = 1;
            memset(f, 0, sizeof *f);
            f = &M->arch;
        }
        if (rc) {
            cact_free(&M->arch);
            free(M);
            return NULL;
        }
    }
    if (M->gen == 2) {
        M->kv_window = (int)f->hdr.kv_window;
        M->be = nd_backend_cpu(0);
        if ((rc = nd_heads_load(f, &M->m, &M->heads))) {
            san_model_free(&M->m);
            cact_free(&M->arch);
            free(M);
            return NULL;
        }
        M->heads.qw = quant ? &M->qw : NULL;
        if (M->heads.contrastive.present) /* only retrieval's index needs it (~0.1 s / 25 MB) */
            nd_sha256(f->data, f->len, M->digest);
    }
    int think;
    nd_idvec tmp = {0};
    if ((rc = nd_cact_tokenizer(f, &M->tok)) || (rc = nd_model_build_trie(M)) ||
        (rc = marker(M, "<|im_end|>", &M->id_im_end)) ||
        (rc = marker(M, "</think>", &M->id_think_end)) || (rc = marker(M, "<think>", &think)) ||
        (rc = marker(M, "</tool_call>", &M->id_tool_call_end)) ||
        (rc = marker(M, "<tool_call>", &M->id_tool_call)))
        goto fail;
    M->id_think = think;
    /* 3.x's fixed BOS (tokenizer.py BOS_ID), whatever the tokenizer says */
    M->id_bos = M->gen == 3 ? ND_V3_BOS_ID : nd_tokenizer_bos_id(M->tok);
    M->id_space = nd_tokenizer_piece_to_id(M->tok, "\xE2\x96\x81", 3);
    if (M->id_space == nd_tokenizer_unk_id(M->tok))
        M->id_space = -1;
    M->reason_ok[M->id_think_end] = 1;
    /* the target as training encodes it starts "▁<think>"; after </think>
     * comes "\n<tool_call>" */
    if ((rc = nd_tokenizer_encode(M->tok, "<think>", 7, &M->think_open)))
        goto fail;
    const char *close = "</think>\n<tool_call>";
    if ((rc = nd_tokenizer_encode(M->tok, close, strlen(close), &tmp)))
        goto fail;
    size_t k = 0;
    while (k < tmp.n && tmp.v[k] != M->id_think_end)
        k++;
    for (k++; k < tmp.n; k++)
        nd_idvec_push(&M->think_close, tmp.v[k]);
    nd_idvec_free(&tmp);
    if (!M->think_close.n || !M->think_open.n) {
        rc = nd_error(ND_EFORMAT, "tokenizer cannot encode the chat markers");
        goto fail;
    }
    nd_cact_release_pages(f); /* sessions map back what they read */
    return M;
fail:
    nd_idvec_free(&tmp);
    needle_model_free(M);
    return NULL;
}

needle_model *needle_model_load_buffer(const void *data, size_t len)
{
    if (!data) {
        nd_error(ND_EARG, "needle_model_load_buffer: NULL data");
        return NULL;
    }
    cact_file f;
    if (nd_tuning_refresh()) /* a C ABI entry: the switches from the environment */
        return NULL;
    int quant = !nd_engine_float_path();
    if (quant ? cact_own_copy(data, len, &f) : cact_parse(data, len, &f))
        return NULL;
    needle_model *M = load_parsed(&f, quant);
    cact_free(&f);
    return M;
}

needle_model *nd_model_load_float_weights(const void *data, size_t len, const san_model *weights)
{
    cact_file f;
    if (cact_parse(data, len, &f))
        return NULL;
    needle_model *M = load_parsed(&f, 0);
    cact_free(&f);
    if (!M)
        return NULL;
    /* same geometry, tensor by tensor, so one copy puts every weight in place */
    int same = M->m.numel == weights->numel && M->m.n_tensors == weights->n_tensors;
    for (int i = 0; same && i < weights->n_tensors; i++)
        same = M->m.tensors[i].offset == weights->tensors[i].offset &&
               M->m.tensors[i].numel == weights->tensors[i].numel;
    if (!same) {
        nd_error(ND_ESHAPE, "the float weights' layout differs from the archive's model");
        needle_model_free(M);
        return NULL;
    }
    memcpy(M->m.mem, weights->mem, weights->numel * sizeof *weights->mem);
    return M;
}

const san_model *nd_model_weights(const needle_model *M)
{
    return M->quant ? NULL : &M->m;
}

needle_model *needle_model_load(const char *path)
{
    if (!path) {
        nd_error(ND_EARG, "needle_model_load: NULL path");
        return NULL;
    }
    cact_file f;
    if (nd_tuning_refresh()) /* a C ABI entry: the switches from the environment */
        return NULL;
    int quant = !nd_engine_float_path();
    if (quant ? cact_map_file(path, &f) : cact_read_file(path, &f))
        return NULL;
    needle_model *M = load_parsed(&f, quant);
    cact_free(&f);
    return M;
}

void needle_model_free(needle_model *M)
{
    if (!M)
        return;
    san_model_free(&M->m);
    nd_qweights_free(&M->qw);
    nd_qweights3_free(&M->qw3);
    cact_free(&M->arch);
    nd_tokenizer_free(M->tok);
    free(M->trie);
    free(M->tok_next);
    free(M->reason_ok);
    nd_idvec_free(&M->think_open);
    nd_idvec_free(&M->think_close);
    nd_heads_free(&M->heads);
    nd_prefix_cache_free(&M->pc);
    free(M);
}

nd_prefix_cache *nd_model_prefix_cache(needle_model *M)
{
    return &M->pc;
}

int needle_model_max_seq_len(const needle_model *M)
{
    return M ? M->m.cfg.max_seq_len : NEEDLE_EARG;
}

const char *needle_model_error(const needle_model *M)
{
    return M ? M->err : "NULL model";
}

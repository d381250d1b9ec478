/* Upstream's chat templates, ids and loss mask (finetune.py 2.x and 3.x). */
#include "text/render.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

static const char *type_name(const nd_pj *v)
{
    switch (v->type) {
    case ND_PJ_NULL: return "null";
    case ND_PJ_FALSE:
    case ND_PJ_TRUE: return "a boolean";
    case ND_PJ_INT:
    case ND_PJ_FLOAT: return "a number";
    case ND_PJ_STRING: return "a string";
    case ND_PJ_ARRAY: return "an array";
    default: return "an object";
    }
}

/* Strings go to SentencePiece raw; Python could not encode a lone
 * surrogate (from a \ud800 escape), so neither do we. */
static int check_raw(const char *field, const char *s, size_t n)
{
    for (size_t i = 0; i + 2 < n; i++)
        if ((unsigned char)s[i] == 0xED && (unsigned char)s[i + 1] >= 0xA0)
            return nd_error(ND_EFORMAT, "%s contains a lone surrogate escape (\\u%04x)", field,
                            0xD000u | ((unsigned char)s[i + 1] & 0x3Fu) << 6 |
                                ((unsigned char)s[i + 2] & 0x3Fu));
    return 0;
}

/* tools / answers: a string is used verbatim, arrays and objects are
 * json.dumps(v, separators=(",", ":")) with ensure_ascii on (Needle 2) or
 * off (Needle 3, raw UTF-8; a lone surrogate then reaches SentencePiece,
 * which Python cannot encode, so it is refused). */
static int put_json_field(const char *field, const nd_pj *v, int ensure_ascii, nd_buf *out)
{
    if (!v)
        return nd_buf_put(out, "[]", 2);
    if (v->type == ND_PJ_STRING) {
        int rc = check_raw(field, v->str, v->len);
        return rc ? rc : nd_buf_put(out, v->str, v->len);
    }
    if (v->type != ND_PJ_ARRAY && v->type != ND_PJ_OBJECT)
        return nd_error(ND_EFORMAT, "%s must be an array, object or string, not %s", field,
                        type_name(v));
    size_t at = out->n;
    int rc = nd_pj_dump_ex(v, 1, ensure_ascii, out);
    if (!rc && !ensure_ascii)
        rc = check_raw(field, out->p + at, out->n - at);
    return rc;
}

static int get_text(const nd_pj *ex, const char *field, const nd_pj **out)
{
    const nd_pj *v = nd_pj_get(ex, field);
    *out = NULL;
    if (!v)
        return 0;
    if (v->type != ND_PJ_STRING)
        return nd_error(ND_EFORMAT, "%s must be a string, not %s", field, type_name(v));
    *out = v;
    return check_raw(field, v->str, v->len);
}

/* Needle 3: (example.get(field) or "").strip() -- any falsy value (absent,
 * null, false, 0, "", [], {}) is "", a truthy non-string has no .strip()
 * upstream (an error here), a string loses str.isspace() at both ends. */
static int get_stripped(const nd_pj *ex, const char *field, const char **s, size_t *n)
{
    const nd_pj *v = nd_pj_get(ex, field);
    *s = "";
    *n = 0;
    if (!v || !nd_pj_truthy(v))
        return 0;
    if (v->type != ND_PJ_STRING)
        return nd_error(ND_EFORMAT, "%s must be a string (or null), not %s", field, type_name(v));
    int rc = check_raw(field, v->str, v->len);
    if (rc)
        return rc;
    *s = v->str;
    *n = v->len;
    nd_py_strip(s, n);
    return 0;
}

#define PUT(b, lit) nd_buf_put(b, lit, sizeof lit - 1)

int nd_render_generation(int generation)
{
    if (generation == 0)
        return ND_RENDER_GEN_DEFAULT;
    return generation == 2 || generation == 3 ? generation : -1;
}

/* The answers value: "answers", else its alias "function_calls". */
static const nd_pj *answers_of(const nd_pj *ex, const char **field)
{
    const nd_pj *a = nd_pj_get(ex, "answers");
    *field = "answers";
    if (!a) {
        a = nd_pj_get(ex, "function_calls");
        *field = "function_calls";
    }
    return a;
}

/* upstream 2.x */
static int render_v2(const nd_pj *ex, nd_buf *prompt, nd_buf *target)
{
    const nd_pj *query, *reasoning, *system = nd_pj_get(ex, "system");
    int rc;
    if ((rc = get_text(ex, "query", &query)) || (rc = get_text(ex, "reasoning", &reasoning)))
        return rc;
    if (!query)
        return nd_error(ND_EFORMAT, "missing \"query\"");
    /* `if system`: any falsy value means no system turn; a truthy
     * non-string would be a TypeError upstream. */
    if (system && !nd_pj_truthy(system))
        system = NULL;
    if (system && (rc = get_text(ex, "system", &system)))
        return rc;
    const char *afield;
    const nd_pj *answers = answers_of(ex, &afield);

    if (system &&
        ((rc = PUT(prompt, "<|im_start|>system\n")) ||
         (rc = nd_buf_put(prompt, system->str, system->len)) || (rc = PUT(prompt, "<|im_end|>\n"))))
        return rc;
    if ((rc = PUT(prompt, "<|im_start|>user\n<tools>")) ||
        (rc = put_json_field("tools", nd_pj_get(ex, "tools"), 1, prompt)) ||
        (rc = PUT(prompt, "</tools>\n")) || (rc = nd_buf_put(prompt, query->str, query->len)) ||
        (rc = PUT(prompt, "<|im_end|>\n<|im_start|>assistant\n")))
        return rc;
    if ((rc = PUT(target, "<think>")) ||
        (reasoning && (rc = nd_buf_put(target, reasoning->str, reasoning->len))) ||
        (rc = PUT(target, "</think>\n<tool_call>")) ||
        (rc = put_json_field(afield, answers, 1, target)) ||
        (rc = PUT(target, "</tool_call><|im_end|>")))
        return rc;
    return 0;
}

/* upstream 3.x: system and reasoning stripped, the <think> block only for
 * non-empty reasoning and with newlines inside it, JSON without
 * ensure_ascii. */
static int render_v3(const nd_pj *ex, nd_buf *prompt, nd_buf *target)
{
    const nd_pj *query;
    const char *reasoning, *system;
    size_t rlen, slen;
    int rc;
    if ((rc = get_text(ex, "query", &query)) ||
        (rc = get_stripped(ex, "reasoning", &reasoning, &rlen)) ||
        (rc = get_stripped(ex, "system", &system, &slen)))
        return rc;
    if (!query)
        return nd_error(ND_EFORMAT, "missing \"query\"");
    const char *afield;
    const nd_pj *answers = answers_of(ex, &afield);

    if (slen && ((rc = PUT(prompt, "<|im_start|>system\n")) ||
                 (rc = nd_buf_put(prompt, system, slen)) || (rc = PUT(prompt, "<|im_end|>\n"))))
        return rc;
    if ((rc = PUT(prompt, "<|im_start|>user\n<tools>")) ||
        (rc = put_json_field("tools", nd_pj_get(ex, "tools"), 0, prompt)) ||
        (rc = PUT(prompt, "</tools>\n")) || (rc = nd_buf_put(prompt, query->str, query->len)) ||
        (rc = PUT(prompt, "<|im_end|>\n<|im_start|>assistant\n")))
        return rc;
    if (rlen && ((rc = PUT(target, "<think>\n")) || (rc = nd_buf_put(target, reasoning, rlen)) ||
                 (rc = PUT(target, "\n</think>\n"))))
        return rc;
    if ((rc = PUT(target, "<tool_call>")) || (rc = put_json_field(afield, answers, 0, target)) ||
        (rc = PUT(target, "</tool_call><|im_end|>")))
        return rc;
    return 0;
}

int nd_render_example_gen(const nd_pj *ex, int generation, nd_buf *prompt, nd_buf *target)
{
    int gen = nd_render_generation(generation);
    if (gen < 0)
        return nd_error(ND_EARG, "unknown model generation %d (2 or 3)", generation);
    if (!ex || ex->type != ND_PJ_OBJECT)
        return nd_error(ND_EFORMAT, "the line is %s, not a JSON object",
                        ex ? type_name(ex) : "empty");
    return gen == 3 ? render_v3(ex, prompt, target) : render_v2(ex, prompt, target);
}

int nd_render_example(const nd_pj *ex, nd_buf *prompt, nd_buf *target)
{
    return nd_render_example_gen(ex, 2, prompt, target);
}

int nd_render_check_vocab(const nd_tokenizer *t, int generation, long model_vocab, const char *path)
{
    int gen = nd_render_generation(generation), n = nd_tokenizer_vocab_size(t);
    if (gen < 0)
        return nd_error(ND_EARG, "unknown model generation %d (2 or 3)", generation);
    if (gen == 2 && n != model_vocab)
        return nd_error(ND_EARG,
                        "tokenizer %s has %d pieces but the checkpoint's vocab_size is %ld", path,
                        n, model_vocab);
    if (gen == 3 && n > model_vocab)
        return nd_error(ND_EARG,
                        "tokenizer %s has %d pieces, the model vocabulary holds %ld (a Needle 3 "
                        "model needs at least as many rows as pieces)",
                        path, n, model_vocab);
    return 0;
}

int nd_render_encode(const nd_tokenizer *t, nd_tok_cache *cache, int generation,
                     const nd_example *ex, nd_idvec *ids, size_t *n_prompt)
{
    int gen = nd_render_generation(generation);
    if (gen < 0)
        return nd_error(ND_EARG, "unknown model generation %d (2 or 3)", generation);
    int32_t bos = gen == 3 ? ND_V3_BOS_ID : nd_tokenizer_bos_id(t),
            eos = gen == 3 ? ND_V3_EOS_ID : nd_tokenizer_eos_id(t);
    int rc = nd_idvec_push(ids, bos);
    size_t start = ids->n - 1;
    if (!rc)
        rc = nd_tokenizer_encode_cached(t, cache, ex->prompt, ex->prompt_len, ids);
    *n_prompt = ids->n - start;
    if (!rc) /* encoded separately: the target gets its own dummy prefix */
        rc = nd_tokenizer_encode_cached(t, cache, ex->target, ex->target_len, ids);
    if (!rc)
        rc = nd_idvec_push(ids, eos);
    return rc;
}

size_t nd_fit_max_len(size_t longest, size_t cap)
{
    size_t bucket = 128, lim = longest < cap ? longest : cap;
    while (bucket < lim)
        bucket *= 2;
    return bucket < cap ? bucket : cap;
}

int nd_render_pack(const int32_t *ids, size_t n, size_t n_prompt, size_t max_len, int32_t pad_id,
                   int32_t *ids_out, float *mask_out)
{
    for (size_t i = 0; i < max_len; i++) {
        ids_out[i] = i < n ? ids[i] : pad_id;
        mask_out[i] = i < n && i >= n_prompt ? 1.0f : 0.0f;
    }
    return n > max_len;
}

void nd_token_set_free(nd_token_set *s)
{
    free(s->ids);
    free(s->mask);
    free(s->len);
    memset(s, 0, sizeof *s);
}

int nd_dataset_tokenize(const nd_dataset *d, const nd_tokenizer *t, size_t cap, nd_token_set *out)
{
    memset(out, 0, sizeof *out);
    if (cap == 0)
        return nd_error(ND_EARG, "max_len must be positive");
    /* Two passes like upstream (fit_max_len, then load_jsonl), but the ids
     * are kept from the first so each example is encoded once. */
    nd_idvec all = {0};
    size_t *off = malloc((d->n + 1) * sizeof *off), *np = malloc((d->n + 1) * sizeof *np);
    nd_tok_cache *cache = nd_tok_cache_new(); /* optional: NULL just runs uncached */
    int rc = off && np ? 0 : nd_error(ND_ENOMEM, "out of memory");
    for (size_t i = 0; i < d->n && !rc; i++) {
        off[i] = all.n;
        rc = nd_render_encode(t, cache, d->generation, &d->ex[i], &all, &np[i]);
        if (rc)
            nd_error_prefix(rc, "line %zu", d->ex[i].line);
        else if (all.n - off[i] > out->longest)
            out->longest = all.n - off[i];
    }
    if (!rc) {
        off[d->n] = all.n;
        out->n = d->n;
        out->max_len = nd_fit_max_len(out->longest, cap);
        size_t cells = d->n * out->max_len;
        out->ids = malloc((cells ? cells : 1) * sizeof *out->ids);
        out->mask = malloc((cells ? cells : 1) * sizeof *out->mask);
        out->len = malloc((d->n ? d->n : 1) * sizeof *out->len);
        if (!out->ids || !out->mask || !out->len)
            rc = nd_error(ND_ENOMEM, "out of memory for %zu x %zu tokens", d->n, out->max_len);
        int32_t pad = nd_render_generation(d->generation) == 3 ? ND_V3_PAD_ID
                      : nd_tokenizer_pad_id(t) >= 0            ? nd_tokenizer_pad_id(t)
                                                               : 0;
        for (size_t i = 0; i < d->n && !rc; i++) {
            size_t n = off[i + 1] - off[i];
            out->truncated +=
                (size_t)nd_render_pack(all.v + off[i], n, np[i], out->max_len, pad,
                                       out->ids + i * out->max_len, out->mask + i * out->max_len);
            out->len[i] = (int32_t)(n < out->max_len ? n : out->max_len);
        }
    }
    nd_tok_cache_free(cache);
    free(off);
    free(np);
    nd_idvec_free(&all);
    if (rc)
        nd_token_set_free(out);
    return rc;
}

/* Upstream's chat template, ids and loss mask (finetune.py). */
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
 * json.dumps(v, separators=(",", ":")). */
static int put_json_field(const char *field, const nd_pj *v, nd_buf *out)
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
    return nd_pj_dump(v, 1, out);
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

#define PUT(b, lit) nd_buf_put(b, lit, sizeof lit - 1)

int nd_render_example(const nd_pj *ex, nd_buf *prompt, nd_buf *target)
{
    if (!ex || ex->type != ND_PJ_OBJECT)
        return nd_error(ND_EFORMAT, "the line is %s, not a JSON object",
                        ex ? type_name(ex) : "empty");
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
    const nd_pj *answers = nd_pj_get(ex, "answers");
    if (!answers)
        answers = nd_pj_get(ex, "function_calls");

    if (system &&
        ((rc = PUT(prompt, "<|im_start|>system\n")) ||
         (rc = nd_buf_put(prompt, system->str, system->len)) || (rc = PUT(prompt, "<|im_end|>\n"))))
        return rc;
    if ((rc = PUT(prompt, "<|im_start|>user\n<tools>")) ||
        (rc = put_json_field("tools", nd_pj_get(ex, "tools"), prompt)) ||
        (rc = PUT(prompt, "</tools>\n")) || (rc = nd_buf_put(prompt, query->str, query->len)) ||
        (rc = PUT(prompt, "<|im_end|>\n<|im_start|>assistant\n")))
        return rc;
    if ((rc = PUT(target, "<think>")) ||
        (reasoning && (rc = nd_buf_put(target, reasoning->str, reasoning->len))) ||
        (rc = PUT(target, "</think>\n<tool_call>")) ||
        (rc = put_json_field(nd_pj_get(ex, "answers") ? "answers" : "function_calls", answers,
                             target)) ||
        (rc = PUT(target, "</tool_call><|im_end|>")))
        return rc;
    return 0;
}

int nd_render_encode(const nd_tokenizer *t, nd_tok_cache *cache, const nd_example *ex,
                     nd_idvec *ids, size_t *n_prompt)
{
    int rc = nd_idvec_push(ids, nd_tokenizer_bos_id(t));
    size_t start = ids->n - 1;
    if (!rc)
        rc = nd_tokenizer_encode_cached(t, cache, ex->prompt, ex->prompt_len, ids);
    *n_prompt = ids->n - start;
    if (!rc) /* encoded separately: the target gets its own dummy prefix */
        rc = nd_tokenizer_encode_cached(t, cache, ex->target, ex->target_len, ids);
    if (!rc)
        rc = nd_idvec_push(ids, nd_tokenizer_eos_id(t));
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
        rc = nd_render_encode(t, cache, &d->ex[i], &all, &np[i]);
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
        int32_t pad = nd_tokenizer_pad_id(t) >= 0 ? nd_tokenizer_pad_id(t) : 0;
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

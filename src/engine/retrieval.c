/* Tool retrieval: text embeddings, the persistent tool index, top-k. */
#define _POSIX_C_SOURCE 200809L
#include "engine/retrieval.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/sha256.h"
#include "core/status.h"

#define INDEX_MAGIC "NDTIDX01"
/* bump when what an embedding means changes (text, truncation, pooling) */
#define INDEX_VERSION 1u
#define INDEX_HEADER 88
#define DIGEST 32

int nd_embed_text(const nd_embedder *e, const char *text, size_t len, float *emb)
{
    int dim = e->heads->contrastive.out_dim;
    nd_idvec ids = {0};
    int rc = nd_tokenizer_encode(e->tok, text, len, &ids);
    if (rc)
        return rc;
    int T = (int)(ids.n < ND_RETRIEVAL_MAX_TOKENS ? ids.n : ND_RETRIEVAL_MAX_TOKENS);
    if (T > e->m->cfg.max_seq_len)
        T = e->m->cfg.max_seq_len;
    if (T == 0)
        memset(emb, 0, (size_t)dim * sizeof *emb);
    else
        rc = nd_head_embed(e->m, e->be, e->heads, ids.v, T, emb);
    nd_idvec_free(&ids);
    return rc;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t entry_bytes(int dim)
{
    return DIGEST + 4 * (size_t)dim;
}

/* A checked-out index file: the entries are trusted from here on. */
typedef struct {
    unsigned char *buf;
    size_t len;
    int n;
    const unsigned char *model, *tools, *entries;
} index_file;

/* ND_OK and f filled, or a refusal reason in `why` (the file is then
 * treated as corrupt). Missing file: ND_EIO with errno ENOENT kept. */
static int read_index(const char *path, int dim, index_file *f, char *why, size_t why_cap,
                      int *missing)
{
    memset(f, 0, sizeof *f);
    *missing = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        *missing = errno == ENOENT;
        snprintf(why, why_cap, "cannot open: %s", strerror(errno));
        return ND_EIO;
    }
    fclose(fp);
    int rc = nd_read_file(path, (size_t)1 << 30, &f->buf, &f->len);
    if (rc) {
        snprintf(why, why_cap, "%s", nd_last_error());
        return rc;
    }
    const unsigned char *p = f->buf;
    unsigned char digest[DIGEST];
#define REFUSE(...)                                                                                \
    do {                                                                                           \
        snprintf(why, why_cap, __VA_ARGS__);                                                       \
        free(f->buf);                                                                              \
        f->buf = NULL;                                                                             \
        return ND_EFORMAT;                                                                         \
    } while (0)
    if (f->len < INDEX_HEADER + DIGEST || memcmp(p, INDEX_MAGIC, 8))
        REFUSE("not a tool index (%zu bytes)", f->len);
    if (get_u32(p + 8) != INDEX_VERSION)
        REFUSE("index version %u, expected %u", get_u32(p + 8), INDEX_VERSION);
    uint32_t fdim = get_u32(p + 12), n = get_u32(p + 16);
    if (fdim != (uint32_t)dim)
        REFUSE("embeddings of %u floats, the model's are %d", fdim, dim);
    if (n > (f->len - INDEX_HEADER - DIGEST) / entry_bytes(dim) ||
        f->len != INDEX_HEADER + (size_t)n * entry_bytes(dim) + DIGEST)
        REFUSE("%zu bytes do not hold %u entries (truncated?)", f->len, n);
    nd_sha256(p, f->len - DIGEST, digest);
    if (memcmp(digest, p + f->len - DIGEST, DIGEST))
        REFUSE("checksum mismatch (corrupt)");
#undef REFUSE
    f->n = (int)n;
    f->model = p + 24;
    f->tools = p + 56;
    f->entries = p + INDEX_HEADER;
    return ND_OK;
}

static int write_index(const char *path, const nd_tool_index *ix, const unsigned char *model,
                       const unsigned char *tools, const unsigned char *tool_digests)
{
    size_t eb = entry_bytes(ix->dim);
    size_t len = INDEX_HEADER + (size_t)ix->n * eb + DIGEST;
    unsigned char *b = calloc(1, len);
    if (!b)
        return nd_error(ND_ENOMEM, "out of memory");
    memcpy(b, INDEX_MAGIC, 8);
    put_u32(b + 8, INDEX_VERSION);
    put_u32(b + 12, (uint32_t)ix->dim);
    put_u32(b + 16, (uint32_t)ix->n);
    memcpy(b + 24, model, DIGEST);
    memcpy(b + 56, tools, DIGEST);
    for (int i = 0; i < ix->n; i++) {
        unsigned char *e = b + INDEX_HEADER + (size_t)i * eb;
        memcpy(e, tool_digests + (size_t)i * DIGEST, DIGEST);
        for (int j = 0; j < ix->dim; j++) {
            uint32_t u;
            memcpy(&u, &ix->emb[(size_t)i * ix->dim + j], 4);
            put_u32(e + DIGEST + 4 * j, u);
        }
    }
    nd_sha256(b, len - DIGEST, b + len - DIGEST);
    int rc = nd_write_file_atomic(path, b, len);
    free(b);
    return rc;
}

int nd_tool_index_build(nd_tool_index *ix, const nd_embedder *e, const char *const *texts,
                        const size_t *lens, int n, const char *path)
{
    memset(ix, 0, sizeof *ix);
    if (!e->heads->contrastive.present)
        return nd_error(ND_EUNSUPPORTED, "the archive has no contrastive head for tool retrieval");
    int dim = e->heads->contrastive.out_dim;
    ix->n = n;
    ix->dim = dim;
    ix->emb = malloc((size_t)n * (size_t)dim * sizeof *ix->emb);
    unsigned char *tool_digests = calloc((size_t)n + 1, DIGEST);
    uint8_t *have = calloc((size_t)n, 1);
    unsigned char tools_digest[DIGEST];
    index_file f = {0};
    int rc = ND_OK;
    if (!ix->emb || !tool_digests || !have) {
        rc = nd_error(ND_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++)
        nd_sha256(texts[i], lens[i], tool_digests + (size_t)i * DIGEST);
    nd_sha256(tool_digests, (size_t)n * DIGEST, tools_digest);

    if (path) {
        char why[256];
        int missing;
        if (read_index(path, dim, &f, why, sizeof why, &missing)) {
            ix->status = missing ? ND_INDEX_CREATED : ND_INDEX_CORRUPT;
            if (!missing)
                snprintf(ix->note, sizeof ix->note, "tool index %s refused and rebuilt: %s", path,
                         why);
        } else if (memcmp(f.model, e->model_digest, DIGEST)) {
            ix->status = ND_INDEX_STALE_MODEL; /* nothing in it is ours */
        } else {
            ix->status = memcmp(f.tools, tools_digest, DIGEST) || f.n != n ? ND_INDEX_STALE_TOOLS
                                                                           : ND_INDEX_REUSED;
            /* entries are keyed by the tool's own digest, so a changed or
             * reordered tool list keeps what still applies */
            size_t eb = entry_bytes(dim);
            for (int i = 0; i < n; i++)
                for (int k = 0; k < f.n; k++) {
                    const unsigned char *en = f.entries + (size_t)k * eb;
                    if (memcmp(en, tool_digests + (size_t)i * DIGEST, DIGEST))
                        continue;
                    for (int j = 0; j < dim; j++) {
                        uint32_t u = get_u32(en + DIGEST + 4 * j);
                        memcpy(&ix->emb[(size_t)i * dim + j], &u, 4);
                    }
                    have[i] = 1;
                    break;
                }
        }
    }
    for (int i = 0; i < n; i++) {
        if (have[i])
            continue;
        if ((rc = nd_embed_text(e, texts[i], lens[i], ix->emb + (size_t)i * dim))) {
            nd_error_prefix(rc, "embedding tool %d for retrieval", i);
            goto done;
        }
        ix->embedded++;
    }
    if (path && ix->status != ND_INDEX_REUSED &&
        write_index(path, ix, e->model_digest, tools_digest, tool_digests)) {
        size_t used = strlen(ix->note);
        snprintf(ix->note + used, sizeof ix->note - used, "%stool index not saved: %s",
                 used ? "; " : "", nd_last_error());
    }
    if (!path)
        ix->status = ND_INDEX_NONE;
done:
    free(f.buf);
    free(tool_digests);
    free(have);
    if (rc)
        nd_tool_index_free(ix);
    return rc;
}

void nd_tool_index_free(nd_tool_index *ix)
{
    free(ix->emb);
    ix->emb = NULL;
    ix->n = 0;
}

void nd_tool_index_top(const nd_tool_index *ix, const float *q, int k, int *sel)
{
    if (k > ix->n)
        k = ix->n;
    double best[ND_RETRIEVAL_TOP_K * 4];
    if (k > (int)(sizeof best / sizeof best[0]))
        k = (int)(sizeof best / sizeof best[0]);
    int have = 0;
    for (int i = 0; i < ix->n; i++) {
        double s = 0;
        for (int j = 0; j < ix->dim; j++)
            s += (double)q[j] * (double)ix->emb[(size_t)i * ix->dim + j];
        if (s != s)
            s = -INFINITY;
        /* insertion into the sorted best list; strict > keeps earlier tools first on ties */
        int pos = have;
        while (pos > 0 && s > best[pos - 1])
            pos--;
        if (pos >= k)
            continue;
        int last = have < k ? have : k - 1;
        for (int j = last; j > pos; j--) {
            best[j] = best[j - 1];
            sel[j] = sel[j - 1];
        }
        best[pos] = s;
        sel[pos] = i;
        if (have < k)
            have++;
    }
}

int nd_retrieval_init(nd_retrieval *r, const nd_embedder *e, const nd_pj *tools,
                      const char *index_path)
{
    memset(r, 0, sizeof *r);
    int n = tools && tools->type == ND_PJ_ARRAY ? (int)tools->len : 0;
    if (n <= ND_RETRIEVAL_TOP_K)
        return ND_OK;
    if (!e->heads->contrastive.present) {
        snprintf(r->note, sizeof r->note,
                 "%d tools and no contrastive head in the archive: all are rendered (no tool "
                 "retrieval)",
                 n);
        return ND_OK;
    }
    nd_buf *texts = calloc((size_t)n, sizeof *texts);
    const char **ptr = malloc((size_t)n * sizeof *ptr);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    int rc = texts && ptr && lens ? ND_OK : nd_error(ND_ENOMEM, "out of memory");
    /* each tool as training renders it: json.dumps(tool, separators=(",", ":")) */
    for (int i = 0; i < n && !rc; i++) {
        if (!(rc = nd_pj_dump(tools->items[i], 1, &texts[i]))) {
            ptr[i] = texts[i].p ? texts[i].p : "";
            lens[i] = texts[i].n;
        }
    }
    if (!rc)
        rc = nd_tool_index_build(&r->index, e, ptr, lens, n, index_path);
    if (!rc) {
        r->on = 1;
        snprintf(r->note, sizeof r->note, "%s", r->index.note);
    }
    for (int i = 0; texts && i < n; i++)
        nd_buf_free(&texts[i]);
    free(texts);
    free(ptr);
    free(lens);
    return rc;
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* a JSON array of the tools tools[sel[0..k)] (borrowed items) */
static nd_pj subset_of(const nd_pj *tools, const int *sel, int k, nd_pj **items)
{
    for (int i = 0; i < k; i++)
        items[i] = tools->items[sel[i]];
    nd_pj subset = {0};
    subset.type = ND_PJ_ARRAY;
    subset.len = (size_t)k;
    subset.items = items;
    return subset;
}

/* tokens of BOS + head + the k tools + "</tools>\n", as the session
 * renders them */
static int prompt_tokens(const nd_retrieval *r, const nd_pj *tools, const int *sel, int k, int *len)
{
    nd_pj *items[ND_RETRIEVAL_TOP_K];
    nd_pj subset = subset_of(tools, sel, k, items);
    nd_buf text = {0};
    nd_idvec ids = {0};
    int rc = nd_buf_put(&text, r->head.p ? r->head.p : "", r->head.n);
    rc = rc ? rc : nd_pj_dump(&subset, 1, &text);
    rc = rc ? rc : nd_buf_put(&text, "</tools>\n", 9);
    rc = rc ? rc : nd_tokenizer_encode(r->tok, text.p, text.n, &ids);
    *len = 1 + (int)ids.n;
    nd_buf_free(&text);
    nd_idvec_free(&ids);
    return rc;
}

/* r->warn: the session's warnings, and which tools this turn left out */
static int turn_note(nd_retrieval *r, const nd_pj *tools, const int *ranked, int k, int k_all,
                     int first_len, int limit)
{
    r->dropped = k_all - k;
    if (!r->tok)
        return ND_OK;
    r->warn.n = 0;
    int rc = nd_buf_put(&r->warn, r->base_warn.p ? r->base_warn.p : "", r->base_warn.n);
    if (rc || !r->dropped)
        return rc ? rc : nd_buf_put(&r->warn, "", 0);
    char line[512];
    int n = snprintf(line, sizeof line,
                     "%stool retrieval: the %d best tools for this query take %d tokens of "
                     "prompt, at most %d fit with room for the query and answer: rendered "
                     "the best %d, left out %d (",
                     r->warn.n ? "\n" : "", k_all, first_len, limit, k, r->dropped);
    rc = nd_buf_put(&r->warn, line, (size_t)n);
    for (int i = k; i < k_all && !rc; i++) {
        const nd_pj *name = nd_pj_get(tools->items[ranked[i]], "name");
        const char *s = name && name->type == ND_PJ_STRING ? name->str : "?";
        size_t len = name && name->type == ND_PJ_STRING ? name->len : 1;
        rc = nd_buf_put(&r->warn, i > k ? ", " : "", i > k ? 2 : 0);
        rc = rc ? rc : nd_buf_put(&r->warn, s, len);
    }
    return rc ? rc : nd_buf_put(&r->warn, ")", 1);
}

int nd_retrieval_fit(nd_retrieval *r, const nd_tokenizer *tok, const char *head, size_t head_len,
                     int max_tokens, const char *warnings)
{
    r->tok = tok;
    r->max_tokens = max_tokens;
    r->head.n = r->base_warn.n = r->warn.n = 0;
    int rc = nd_buf_put(&r->head, head, head_len);
    rc = rc ? rc
            : nd_buf_put(&r->base_warn, warnings ? warnings : "", warnings ? strlen(warnings) : 0);
    rc = rc ? rc : nd_buf_put(&r->warn, r->base_warn.p, r->base_warn.n);
    return rc;
}

const char *nd_retrieval_warnings(const nd_retrieval *r)
{
    return r->tok && r->warn.p ? r->warn.p : NULL;
}

int nd_retrieval_select(nd_retrieval *r, const nd_embedder *e, const nd_pj *tools,
                        const char *query, int require_call, nd_buf *tools_text, nd_grammar **gram)
{
    int dim = r->index.dim, sel[ND_RETRIEVAL_TOP_K];
    float *q = malloc((size_t)dim * sizeof *q);
    if (!q)
        return nd_error(ND_ENOMEM, "out of memory");
    int rc = nd_embed_text(e, query, strlen(query), q);
    if (rc) {
        free(q);
        return nd_error_prefix(rc, "embedding the query for tool retrieval");
    }
    int k = r->index.n < ND_RETRIEVAL_TOP_K ? r->index.n : ND_RETRIEVAL_TOP_K;
    nd_tool_index_top(&r->index, q, k, sel);
    free(q);
    int ranked[ND_RETRIEVAL_TOP_K], k_all = k, first_len = 0;
    memcpy(ranked, sel, sizeof sel);
    /* the best-ranked tools that fit the context (at least the best one:
     * when even it does not fit, the session says so) */
    int limit = r->max_tokens - ND_RETRIEVAL_ANSWER_TOKENS;
    for (; r->max_tokens > 0 && k > 1; k--) {
        int len;
        memcpy(sel, ranked, sizeof sel);
        qsort(sel, (size_t)k, sizeof sel[0], cmp_int);
        if ((rc = prompt_tokens(r, tools, sel, k, &len)))
            return rc;
        if (k == k_all)
            first_len = len;
        if (len <= limit)
            break;
    }
    memcpy(sel, ranked, sizeof sel);
    /* rendered in declaration order, like a plain tool list */
    qsort(sel, (size_t)k, sizeof sel[0], cmp_int);
    if ((rc = turn_note(r, tools, ranked, k, k_all, first_len, limit)))
        return rc;
    if (r->n_sel == k && *gram && !memcmp(sel, r->sel, (size_t)k * sizeof sel[0]))
        return ND_OK;
    /* a subset rendered before: its grammar from the cache */
    int slot = -1, lru = 0;
    for (int i = 0; i < ND_RETRIEVAL_CACHE; i++) {
        if (r->cache[i].gram && r->cache[i].k == k &&
            !memcmp(r->cache[i].sel, sel, (size_t)k * sizeof sel[0]))
            slot = i;
        if (!r->cache[i].gram || (r->cache[lru].gram && r->cache[i].used < r->cache[lru].used))
            lru = i;
    }
    if (slot < 0) {
        nd_pj *items[ND_RETRIEVAL_TOP_K];
        nd_pj subset = subset_of(tools, sel, k, items);
        nd_grammar *g = NULL;
        nd_buf text = {0};
        if ((rc = nd_gram_compile(&subset, &g)) || (rc = nd_pj_dump(&subset, 1, &text))) {
            nd_gram_free(g);
            nd_buf_free(&text);
            return rc;
        }
        r->compiled++;
        /* the least recently used entry goes (never the one in use: that
         * is the most recent) */
        slot = lru;
        nd_gram_free(r->cache[slot].gram);
        nd_buf_free(&r->cache[slot].text);
        r->cache[slot].gram = g;
        r->cache[slot].text = text;
        r->cache[slot].k = k;
        memcpy(r->cache[slot].sel, sel, sizeof sel);
    }
    nd_buf copy = {0};
    if ((rc = nd_buf_put(&copy, r->cache[slot].text.p, r->cache[slot].text.n)))
        return rc;
    r->cache[slot].used = ++r->clock;
    nd_gram_require_call(r->cache[slot].gram, require_call);
    *gram = r->cache[slot].gram;
    nd_buf_free(tools_text);
    *tools_text = copy;
    memcpy(r->sel, sel, sizeof sel);
    r->n_sel = k;
    return ND_OK;
}

void nd_retrieval_free(nd_retrieval *r)
{
    nd_tool_index_free(&r->index);
    nd_buf_free(&r->head);
    nd_buf_free(&r->base_warn);
    nd_buf_free(&r->warn);
    for (int i = 0; i < ND_RETRIEVAL_CACHE; i++) {
        nd_gram_free(r->cache[i].gram);
        r->cache[i].gram = NULL;
        nd_buf_free(&r->cache[i].text);
    }
}

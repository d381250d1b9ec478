/* Encoding: SentencePiece normalisation followed by its BPE merge loop.
 *
 * The merge loop is the classic one: symbols in a doubly linked list, all
 * adjacent pairs that form a known piece in a max-heap keyed by (score,
 * leftmost), stale heap entries detected by their recorded length. That is
 * O(n log n) and, importantly, picks merges in exactly SentencePiece's
 * order, so ties and overlapping candidates resolve identically. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

#define MAX_TEXT ((size_t)1 << 30) /* indices below are int32 */

size_t nd_utf8_valid_len(const unsigned char *s, size_t n)
{
    if (!n)
        return 0;
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80)
            return 0;
        uint32_t cp = (c & 0x1Fu) << 6 | (s[1] & 0x3Fu);
        return cp >= 0x80 ? 2 : 0;
    }
    if ((c & 0xF0) == 0xE0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        uint32_t cp = (c & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
        return cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF) ? 3 : 0;
    }
    if ((c & 0xF8) == 0xF0) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        uint32_t cp =
            (c & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
        return cp >= 0x10000 && cp <= 0x10FFFF ? 4 : 0;
    }
    return 0;
}

/* Byte length of the character starting with lead byte c, from the lead
 * byte alone (SentencePiece's OneCharLen), clipped to what is left. */
static size_t one_char_len(const unsigned char *s, size_t n)
{
    static const unsigned char len_of[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t l = len_of[s[0] >> 4];
    return l < n ? l : n;
}

/* Longest user-defined symbol that prefixes s, or 0. */
static size_t ud_match(const nd_tokenizer *t, const unsigned char *s, size_t n)
{
    for (uint32_t k = t->ud_start[s[0]]; k < t->ud_start[s[0] + 1]; k++) {
        int id = t->ud_ids[k];
        if (t->plen[id] <= n && !memcmp(t->piece[id], s, t->plen[id]))
            return t->plen[id];
    }
    return 0;
}

/* Longest charsmap rule that prefixes s: returns its length and points
 * *rep at the NUL-terminated replacement. Walks the darts-clone double
 * array, bounds-checked so a hostile charsmap cannot read out of range. */
static size_t trie_match(const nd_tokenizer *t, const unsigned char *s, size_t n, const char **rep)
{
    const uint32_t *a = t->trie;
    size_t units = t->trie_units, best = 0;
    uint32_t u = a[0];
    size_t node = (u >> 10) << ((u & (1u << 9)) >> 6);
    for (size_t i = 0; i < n; i++) {
        node ^= s[i];
        if (node >= units)
            break;
        u = a[node];
        if ((u & ((1u << 31) | 0xFFu)) != s[i])
            break;
        node ^= (u >> 10) << ((u & (1u << 9)) >> 6);
        if ((u >> 8) & 1) {
            if (node >= units)
                break;
            uint32_t v = a[node] & 0x7FFFFFFFu;
            if (v < t->norm_len) {
                best = i + 1;
                *rep = t->norm_strs + v;
            }
        }
    }
    return best;
}

/* One normalisation step: what the next input character(s) become.
 * (out, out_len) is the replacement; returns how many input bytes it used. */
static size_t norm_prefix(const nd_tokenizer *t, const unsigned char *s, size_t n, const char **out,
                          size_t *out_len)
{
    size_t l = t->ud_ids && t->ud_start[256] ? ud_match(t, s, n) : 0;
    if (l) { /* user-defined symbols are never normalised */
        *out = (const char *)s;
        *out_len = l;
        return l;
    }
    if (t->trie) {
        const char *rep = NULL;
        l = trie_match(t, s, n, &rep);
        if (l) {
            *out = rep;
            *out_len = strlen(rep);
            return l;
        }
    }
    l = nd_utf8_valid_len(s, n);
    if (!l) { /* malformed: U+FFFD, consuming one byte */
        *out = "\xEF\xBF\xBD";
        *out_len = 3;
        return 1;
    }
    *out = (const char *)s;
    *out_len = l;
    return l;
}

typedef struct {
    char *p;
    size_t n, cap;
} nbuf;

static int nb_reserve(nbuf *b, size_t extra)
{
    if (b->cap - b->n >= extra)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->n < extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return nd_error(ND_ENOMEM, "out of memory normalising text");
    b->p = p;
    b->cap = cap;
    return 0;
}

#define SPACE_SYM "\xE2\x96\x81"

static int normalize(const nd_tokenizer *t, const unsigned char *s, size_t n, nbuf *out)
{
    const char *r;
    size_t rl, pos = 0;
    out->n = 0;
    if (t->remove_extra_ws) /* leading characters that normalise to exactly " " */
        while (pos < n) {
            size_t used = norm_prefix(t, s + pos, n - pos, &r, &rl);
            if (rl != 1 || r[0] != ' ')
                break;
            pos += used;
        }
    if (pos == n)
        return 0;
    const char *ws = t->escape_ws ? SPACE_SYM : " ";
    size_t wsl = t->escape_ws ? 3 : 1;
    int rc = nb_reserve(out, n + n / 2 + 8);
    if (rc)
        return rc;
    if (!t->ws_as_suffix && t->add_dummy_prefix) {
        memcpy(out->p, ws, wsl);
        out->n = wsl;
    }
    int prev_space = t->remove_extra_ws;
    while (pos < n) {
        size_t used = norm_prefix(t, s + pos, n - pos, &r, &rl);
        while (prev_space && rl && r[0] == ' ') {
            r++;
            rl--;
        }
        if (rl) {
            if ((rc = nb_reserve(out, rl * 3)) != 0)
                return rc;
            for (size_t i = 0; i < rl; i++) {
                if (r[i] == ' ' && t->escape_ws) {
                    memcpy(out->p + out->n, SPACE_SYM, 3);
                    out->n += 3;
                } else {
                    out->p[out->n++] = r[i];
                }
            }
            prev_space = r[rl - 1] == ' ';
        }
        pos += used;
        if (!t->remove_extra_ws)
            prev_space = 0;
    }
    if (t->remove_extra_ws)
        while (out->n >= wsl && !memcmp(out->p + out->n - wsl, ws, wsl))
            out->n -= wsl;
    if (t->ws_as_suffix && t->add_dummy_prefix) {
        if ((rc = nb_reserve(out, wsl)) != 0)
            return rc;
        memcpy(out->p + out->n, ws, wsl);
        out->n += wsl;
    }
    return 0;
}

/* ---- BPE ---- */

typedef struct {
    int32_t prev, next;
    uint32_t start, len; /* span of the normalised text */
    uint8_t freeze;      /* user-defined symbol: never merged */
} sym;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t size;
} cand;

typedef struct {
    cand *h;
    size_t n, cap;
} heap;

/* a ranks above b: higher score, then the leftmost pair. */
static int above(const cand *a, const cand *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(heap *hp, cand c)
{
    if (hp->n == hp->cap) {
        size_t cap = hp->cap ? hp->cap * 2 : 256;
        cand *h = realloc(hp->h, cap * sizeof *h);
        if (!h)
            return nd_error(ND_ENOMEM, "out of memory in BPE");
        hp->h = h;
        hp->cap = cap;
    }
    size_t i = hp->n++;
    while (i && above(&c, &hp->h[(i - 1) / 2])) {
        hp->h[i] = hp->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    hp->h[i] = c;
    return 0;
}

static cand heap_pop(heap *hp)
{
    cand top = hp->h[0], last = hp->h[--hp->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= hp->n)
            break;
        if (c + 1 < hp->n && above(&hp->h[c + 1], &hp->h[c]))
            c++;
        if (!above(&hp->h[c], &last))
            break;
        hp->h[i] = hp->h[c];
        i = c;
    }
    if (hp->n)
        hp->h[i] = last;
    return top;
}

typedef struct {
    const nd_tokenizer *t;
    const char *text; /* normalised */
    sym *s;
    heap hp;
    uint32_t *split; /* UNUSED piece id -> left length of its last merge (0 = none) */
    nd_idvec *out;
    int prev_unk;
} bpe;

static int maybe_add(bpe *b, int32_t l, int32_t r)
{
    if (l < 0 || r < 0 || b->s[l].freeze || b->s[r].freeze)
        return 0;
    uint32_t len = b->s[l].len + b->s[r].len;
    if (len > b->t->max_normal_len)
        return 0;
    int id = nd_piece_map_find(b->t, &b->t->normal, b->text + b->s[l].start, len);
    if (id < 0)
        return 0;
    if (b->split && b->t->type[id] == ND_SPM_UNUSED)
        b->split[id] = b->s[l].len;
    return heap_push(&b->hp, (cand){b->t->score[id], l, r, len});
}

/* Emit the ids for one final piece (SentencePiece's resegment + the
 * byte-fallback / unknown-merging of PopulateSentencePieceText). */
static int emit(bpe *b, const char *w, uint32_t len, int depth)
{
    const nd_tokenizer *t = b->t;
    int id = nd_tokenizer_piece_to_id(t, w, len), rc = 0;
    if (t->type[id] == ND_SPM_UNUSED && b->split && b->split[id] && b->split[id] < len &&
        depth < 64) {
        uint32_t k = b->split[id];
        if ((rc = emit(b, w, k, depth + 1)) == 0)
            rc = emit(b, w + k, len - k, depth + 1);
        return rc;
    }
    int is_unk = t->type[id] == ND_SPM_UNKNOWN;
    if (is_unk && t->byte_fallback) {
        for (uint32_t i = 0; i < len && !rc; i++)
            rc = nd_idvec_push(b->out, t->byte_ids[(unsigned char)w[i]]);
    } else if (!(is_unk && b->prev_unk)) { /* runs of unknowns collapse into one */
        rc = nd_idvec_push(b->out, id);
    }
    b->prev_unk = is_unk;
    return rc;
}

/* ---- segment cache ----
 * When no piece contains the whitespace symbol except at its start (true
 * for every model trained with whitespace splitting; checked at load), a
 * merge can never cross the position before a "▁", nor a user-defined
 * symbol. The text then falls into independent segments whose merge
 * results can be memoised: a segment's merges, restricted from the global
 * order, happen in the same relative order. */

#define CACHE_MAX_SEG 256
#define CACHE_MAX_BYTES ((size_t)32 << 20)

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len, val_off, val_n;
} centry;

struct nd_tok_cache {
    centry *tab;
    size_t mask, used;
    char *keys;
    size_t keys_n, keys_cap;
    uint16_t *lens; /* final symbol lengths of each cached segment */
    size_t lens_n, lens_cap;
};

nd_tok_cache *nd_tok_cache_new(void)
{
    nd_tok_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->mask = 4095;
    c->tab = calloc(c->mask + 1, sizeof *c->tab);
    if (!c->tab) {
        free(c);
        return NULL;
    }
    return c;
}

void nd_tok_cache_free(nd_tok_cache *c)
{
    if (!c)
        return;
    free(c->tab);
    free(c->keys);
    free(c->lens);
    free(c);
}

static const centry *cache_find(const nd_tok_cache *c, const char *k, uint32_t n, uint64_t h)
{
    for (size_t i = (size_t)h & c->mask;; i = (i + 1) & c->mask) {
        const centry *e = &c->tab[i];
        if (!e->key_len)
            return NULL;
        if (e->hash == h && e->key_len == n && !memcmp(c->keys + e->key_off, k, n))
            return e;
    }
}

/* Best effort: on allocation failure or when full, the cache is cleared or
 * the entry dropped; results never depend on it. */
static void cache_put(nd_tok_cache *c, const char *k, uint32_t n, uint64_t h, const uint16_t *lens,
                      uint32_t nl)
{
    if (c->keys_n + n > CACHE_MAX_BYTES || (c->used + 1) * 2 > c->mask + 1) {
        if (c->keys_n + n > CACHE_MAX_BYTES || c->mask + 1 >= ((size_t)1 << 22)) {
            memset(c->tab, 0, (c->mask + 1) * sizeof *c->tab); /* full: start over */
            c->used = c->keys_n = c->lens_n = 0;
        } else {
            size_t nm = c->mask * 2 + 1;
            centry *nt = calloc(nm + 1, sizeof *nt);
            if (!nt)
                return;
            for (size_t i = 0; i <= c->mask; i++) {
                if (!c->tab[i].key_len)
                    continue;
                size_t j = (size_t)c->tab[i].hash & nm;
                while (nt[j].key_len)
                    j = (j + 1) & nm;
                nt[j] = c->tab[i];
            }
            free(c->tab);
            c->tab = nt;
            c->mask = nm;
        }
    }
    if (c->keys_cap - c->keys_n < n) {
        size_t cap = c->keys_cap ? c->keys_cap * 2 : 65536;
        while (cap - c->keys_n < n)
            cap *= 2;
        char *nk = realloc(c->keys, cap);
        if (!nk)
            return;
        c->keys = nk;
        c->keys_cap = cap;
    }
    if (c->lens_cap - c->lens_n < nl) {
        size_t cap = c->lens_cap ? c->lens_cap * 2 : 16384;
        while (cap - c->lens_n < nl)
            cap *= 2;
        uint16_t *nl2 = realloc(c->lens, cap * sizeof *nl2);
        if (!nl2)
            return;
        c->lens = nl2;
        c->lens_cap = cap;
    }
    size_t i = (size_t)h & c->mask;
    while (c->tab[i].key_len)
        i = (i + 1) & c->mask;
    memcpy(c->keys + c->keys_n, k, n);
    memcpy(c->lens + c->lens_n, lens, nl * sizeof *lens);
    c->tab[i] = (centry){h, (uint32_t)c->keys_n, n, (uint32_t)c->lens_n, nl};
    c->keys_n += n;
    c->lens_n += nl;
    c->used++;
}

/* Merge symbols [i0, i1) (already unlinked from their neighbours). */
static int merge_segment(bpe *b, int32_t i0, int32_t i1)
{
    int rc = 0;
    b->hp.n = 0;
    for (int32_t i = i0 + 1; i < i1 && !rc; i++)
        rc = maybe_add(b, i - 1, i);
    while (b->hp.n && !rc) {
        cand c = heap_pop(&b->hp);
        sym *L = &b->s[c.left], *R = &b->s[c.right];
        if (!L->len || !R->len || L->len + R->len != c.size)
            continue; /* stale: one side has changed since it was queued */
        L->len += R->len;
        L->next = R->next;
        if (R->next >= 0)
            b->s[R->next].prev = c.left;
        R->len = 0;
        rc = maybe_add(b, L->prev, c.left);
        if (!rc)
            rc = maybe_add(b, c.left, L->next);
    }
    return rc;
}

static int run_bpe(const nd_tokenizer *t, nd_tok_cache *cache, const char *text, size_t n,
                   nd_idvec *out)
{
    if (!n)
        return 0;
    bpe b = {t, text, malloc(n * sizeof(sym)), {0}, NULL, out, 0};
    int rc = 0;
    if (!b.s)
        return nd_error(ND_ENOMEM, "out of memory in BPE (%zu bytes of text)", n);
    if (t->has_unused && !(b.split = calloc((size_t)t->n, sizeof *b.split))) {
        free(b.s);
        return nd_error(ND_ENOMEM, "out of memory in BPE");
    }
    const unsigned char *u = (const unsigned char *)text;
    int32_t ns = 0;
    for (size_t pos = 0; pos < n; ns++) {
        size_t l = t->ud_start[256] ? ud_match(t, u + pos, n - pos) : 0;
        b.s[ns].freeze = l != 0;
        if (!l)
            l = one_char_len(u + pos, n - pos);
        b.s[ns].start = (uint32_t)pos;
        b.s[ns].len = (uint32_t)l;
        b.s[ns].prev = ns - 1;
        pos += l;
        b.s[ns].next = pos < n ? ns + 1 : -1;
    }
    const char *ws = t->escape_ws ? SPACE_SYM : " ";
    size_t wsl = t->escape_ws ? 3 : 1;
    uint16_t lens[CACHE_MAX_SEG];
    for (int32_t i0 = 0, i1; i0 < ns && !rc; i0 = i1) {
        i1 = i0 + 1;
        if (t->seg_ok) /* extend to the next safe boundary */
            while (i1 < ns && !b.s[i1].freeze && !b.s[i1 - 1].freeze &&
                   !(b.s[i1].len >= wsl && !memcmp(text + b.s[i1].start, ws, wsl)))
                i1++;
        else
            i1 = ns;
        const char *seg = text + b.s[i0].start;
        uint32_t seg_len = b.s[i1 - 1].start + b.s[i1 - 1].len - b.s[i0].start;
        uint64_t h = 0;
        const centry *hit = NULL;
        int use_cache = cache && t->seg_ok && seg_len <= CACHE_MAX_SEG;
        if (use_cache) {
            h = nd_piece_hash(seg, seg_len) | 1;
            hit = cache_find(cache, seg, seg_len, h);
        }
        if (hit) {
            const uint16_t *ln = cache->lens + hit->val_off;
            for (uint32_t k = 0, off = 0; k < hit->val_n && !rc; off += ln[k++])
                rc = emit(&b, seg + off, ln[k], 0);
            continue;
        }
        b.s[i0].prev = -1;
        b.s[i1 - 1].next = -1;
        rc = merge_segment(&b, i0, i1);
        uint32_t nl = 0;
        for (int32_t i = i0; i >= 0 && !rc; i = b.s[i].next) {
            rc = emit(&b, text + b.s[i].start, b.s[i].len, 0);
            if (use_cache)
                lens[nl++] = (uint16_t)b.s[i].len;
        }
        if (!rc && use_cache)
            cache_put(cache, seg, seg_len, h, lens, nl);
    }
    free(b.s);
    free(b.hp.h);
    free(b.split);
    return rc;
}

int nd_tokenizer_encode(const nd_tokenizer *t, const char *text, size_t len, nd_idvec *out)
{
    return nd_tokenizer_encode_cached(t, NULL, text, len, out);
}

int nd_tokenizer_encode_cached(const nd_tokenizer *t, nd_tok_cache *cache, const char *text,
                               size_t len, nd_idvec *out)
{
    if (!len)
        return 0;
    if (!text)
        return nd_error(ND_EARG, "NULL text");
    if (len > MAX_TEXT)
        return nd_error(ND_ELIMIT, "text of %zu bytes is over the %zu-byte limit", len, MAX_TEXT);
    nbuf nb = {0};
    int rc = normalize(t, (const unsigned char *)text, len, &nb);
    if (!rc && nb.n > (size_t)INT32_MAX)
        rc = nd_error(ND_ELIMIT, "normalised text too long");
    if (!rc)
        rc = run_bpe(t, cache, nb.p, nb.n, out);
    free(nb.p);
    return rc;
}

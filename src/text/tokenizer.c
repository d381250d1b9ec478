/* Tokenizer construction (from .model or .cact blob), blob writer, decode. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "text/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/status.h"
#include "text/tokenizer_internal.h"

#define BLOB_HDR 24 /* "<IIIIIBBH" */
#define BLOB_REC 7  /* "<fBH" */

/* Upstream's CHAT_MARKERS: the first ten are Needle 2's (tokenizer.py 2.x),
 * all 24 Needle 3's (3.x); the blob types exactly these USER_DEFINED. */
static const char *const chat_markers[] = {
    "<|im_start|>", "<|im_end|>",   "<think>",       "</think>",       "<tools>",   "</tools>",
    "<tool_call>",  "</tool_call>", "<tool_result>", "</tool_result>", "<context>", "</context>",
    "<image>",      "</image>",     "<speech>",      "</speech>",      "<tts>",     "</tts>",
    "<imagen>",     "</imagen>",    "<extract>",     "</extract>",     "<schema>",  "</schema>",
};
#define N_MARKERS_V2 10

int nd_idvec_push(nd_idvec *iv, int32_t id)
{
    if (iv->n == iv->cap) {
        size_t cap = iv->cap ? iv->cap * 2 : 64;
        int32_t *v = realloc(iv->v, cap * sizeof *v);
        if (!v)
            return nd_error(ND_ENOMEM, "out of memory for %zu token ids", cap);
        iv->v = v;
        iv->cap = cap;
    }
    iv->v[iv->n++] = id;
    return 0;
}

void nd_idvec_free(nd_idvec *iv)
{
    free(iv->v);
    memset(iv, 0, sizeof *iv);
}

/* ---- piece maps ---- */

uint64_t nd_piece_hash(const char *s, size_t len)
{
    /* FNV-1a, widened: pieces are short so this is cheap and well mixed. */
    uint64_t h = 1469598103934665603ull ^ len;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

int nd_piece_map_find(const nd_tokenizer *t, const nd_piece_map *m, const char *s, size_t len)
{
    size_t i = (size_t)nd_piece_hash(s, len) & m->mask;
    for (;;) {
        int32_t id = m->slots[i];
        if (id < 0)
            return -1;
        if (t->plen[id] == len && !memcmp(t->piece[id], s, len))
            return id;
        i = (i + 1) & m->mask;
    }
}

static int map_init(nd_piece_map *m, int n)
{
    size_t cap = 16;
    while (cap < (size_t)n * 2 + 2)
        cap <<= 1;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots)
        return nd_error(ND_ENOMEM, "out of memory for the piece table");
    memset(m->slots, 0xff, cap * sizeof *m->slots);
    m->mask = cap - 1;
    return 0;
}

/* Insert id; returns 1 if the piece was already present (SentencePiece
 * rejects such models). */
static int map_insert(nd_tokenizer *t, nd_piece_map *m, int id)
{
    size_t i = (size_t)nd_piece_hash(t->piece[id], t->plen[id]) & m->mask;
    while (m->slots[i] >= 0) {
        int32_t o = m->slots[i];
        if (t->plen[o] == t->plen[id] && !memcmp(t->piece[o], t->piece[id], t->plen[id]))
            return 1;
        i = (i + 1) & m->mask;
    }
    m->slots[i] = id;
    return 0;
}

/* "<0xNN>" (upper-case hex, as SentencePiece writes them) -> byte, or -1. */
static int piece_to_byte(const char *p, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    if (len != 6 || memcmp(p, "<0x", 3) || p[5] != '>')
        return -1;
    const char *a = memchr(hex, p[3], 16), *b = memchr(hex, p[4], 16);
    if (!a || !b || !p[3] || !p[4])
        return -1;
    return (int)((a - hex) * 16 + (b - hex));
}

void nd_tokenizer_free(nd_tokenizer *t)
{
    if (!t)
        return;
    free(t->piece);
    free(t->plen);
    free(t->score);
    free(t->type);
    free(t->arena);
    free(t->normal.slots);
    free(t->reserved.slots);
    free(t->trie);
    free(t->unk_surface);
    free(t->ud_ids);
    free(t);
}

/* Allocate a tokenizer with room for n pieces of total `bytes` text. */
static int tok_alloc(int n, size_t bytes, nd_tokenizer **out)
{
    nd_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return nd_error(ND_ENOMEM, "out of memory");
    t->n = n;
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->plen = calloc((size_t)n, sizeof *t->plen);
    t->score = calloc((size_t)n, sizeof *t->score);
    t->type = calloc((size_t)n, sizeof *t->type);
    t->arena = malloc(bytes + (size_t)n + 1);
    if (!t->piece || !t->plen || !t->score || !t->type || !t->arena) {
        nd_tokenizer_free(t);
        return nd_error(ND_ENOMEM, "out of memory for %d pieces", n);
    }
    *out = t;
    return 0;
}

typedef struct {
    unsigned char first;
    uint32_t len;
    int32_t id;
} ud_key;

/* (first byte, longer first, lower id) so the first hit is the longest. */
static int cmp_ud(const void *a, const void *b)
{
    const ud_key *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Build the lookup structures once pieces/types/flags are filled in, with
 * the same consistency checks SentencePiece applies when loading. */
static int tok_finish(nd_tokenizer *t, int unk_from_type)
{
    int rc;
    if ((rc = map_init(&t->normal, t->n)) || (rc = map_init(&t->reserved, t->n)))
        return rc;
    for (int b = 0; b < 256; b++)
        t->byte_ids[b] = -1;
    int n_ud = 0, unk = -1;
    for (int i = 0; i < t->n; i++) {
        int ty = t->type[i];
        if (t->plen[i] == 0)
            return nd_error(ND_EFORMAT, "piece %d is empty", i);
        int normal = ty == ND_SPM_NORMAL || ty == ND_SPM_USER_DEFINED || ty == ND_SPM_UNUSED;
        if (map_insert(t, normal ? &t->normal : &t->reserved, i))
            return nd_error(ND_EFORMAT, "piece %d (%.*s) is defined twice", i, (int)t->plen[i],
                            t->piece[i]);
        if (normal && t->plen[i] > t->max_normal_len)
            t->max_normal_len = t->plen[i];
        if (ty == ND_SPM_UNUSED)
            t->has_unused = 1;
        if (ty == ND_SPM_USER_DEFINED)
            n_ud++;
        if (ty == ND_SPM_UNKNOWN) {
            if (unk >= 0)
                return nd_error(ND_EFORMAT, "two unknown pieces (%d and %d)", unk, i);
            unk = i;
        }
        if (ty == ND_SPM_BYTE) {
            int b = piece_to_byte(t->piece[i], t->plen[i]);
            if (!t->byte_fallback)
                return nd_error(ND_EFORMAT, "byte piece %d found although byte_fallback is off", i);
            if (b < 0)
                return nd_error(ND_EFORMAT, "piece %d is typed BYTE but is not <0xNN>", i);
            t->byte_ids[b] = i;
        }
    }
    if (unk_from_type) {
        if (unk < 0)
            return nd_error(ND_EFORMAT, "the model defines no unknown piece");
        t->unk_id = unk;
    } else if (t->unk_id < 0 || t->unk_id >= t->n) {
        return nd_error(ND_EFORMAT, "unk id %d out of range", t->unk_id);
    }
    if (t->byte_fallback)
        for (int b = 0; b < 256; b++)
            if (t->byte_ids[b] < 0)
                return nd_error(ND_EFORMAT, "byte_fallback is on but piece <0x%02X> is missing", b);
    t->ud_ids = malloc(((size_t)n_ud + 1) * sizeof *t->ud_ids);
    ud_key *keys = malloc(((size_t)n_ud + 1) * sizeof *keys);
    if (!t->ud_ids || !keys) {
        free(keys);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < t->n; i++)
        if (t->type[i] == ND_SPM_USER_DEFINED)
            keys[k++] = (ud_key){(unsigned char)t->piece[i][0], t->plen[i], i};
    qsort(keys, (size_t)n_ud, sizeof *keys, cmp_ud);
    for (k = 0; k < n_ud; k++)
        t->ud_ids[k] = keys[k].id;
    free(keys);
    int j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < n_ud && (unsigned char)t->piece[t->ud_ids[j]][0] < b)
            j++;
        t->ud_start[b] = (uint32_t)j;
    }
    /* Segment-wise encoding is exact only if no mergeable piece holds the
     * whitespace symbol past its first byte, and no UNUSED pieces exist
     * (their re-splitting depends on merges anywhere in the text). */
    const char *ws = t->escape_ws ? "\xE2\x96\x81" : " ";
    size_t wsl = t->escape_ws ? 3 : 1;
    t->seg_ok = !t->has_unused;
    for (int i = 0; i < t->n && t->seg_ok; i++) {
        int ty = t->type[i];
        if (ty != ND_SPM_NORMAL && ty != ND_SPM_USER_DEFINED)
            continue;
        for (size_t k = 1; k + wsl <= t->plen[i]; k++)
            if (!memcmp(t->piece[i] + k, ws, wsl))
                t->seg_ok = 0;
    }
    if (!t->unk_surface && !(t->unk_surface = strdup(" \xE2\x81\x87 ")))
        return nd_error(ND_ENOMEM, "out of memory");
    return 0;
}

/* precompiled_charsmap = u32 trie size, darts-clone units, NUL-separated
 * replacement strings. Copied into aligned memory. */
static int load_charsmap(nd_tokenizer *t, const unsigned char *cm, size_t len)
{
    if (len <= 4)
        return nd_error(ND_EFORMAT, "precompiled_charsmap is %zu bytes, too short", len);
    uint32_t tsz =
        (uint32_t)cm[0] | (uint32_t)cm[1] << 8 | (uint32_t)cm[2] << 16 | (uint32_t)cm[3] << 24;
    if ((size_t)tsz >= len - 4 + 1 || tsz % 4 || tsz == 0)
        return nd_error(ND_EFORMAT, "precompiled_charsmap trie size %u does not fit %zu bytes", tsz,
                        len);
    size_t units = tsz / 4, nlen = len - 4 - tsz;
    t->trie = malloc(tsz + nlen + 1);
    if (!t->trie)
        return nd_error(ND_ENOMEM, "out of memory for the charsmap");
    for (size_t i = 0; i < units; i++) {
        const unsigned char *p = cm + 4 + 4 * i;
        t->trie[i] =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
    char *strs = (char *)(t->trie + units);
    memcpy(strs, cm + 4 + tsz, nlen);
    strs[nlen] = 0; /* a truncated final string ends at the blob's end */
    t->trie_units = units;
    t->norm_strs = strs;
    t->norm_len = nlen;
    return 0;
}

int nd_tokenizer_from_spm(const nd_spm_model *m, nd_tokenizer **out)
{
    *out = NULL;
    if (m->model_type != ND_SPM_BPE)
        return nd_error(ND_EUNSUPPORTED, "only BPE models are supported (model_type is %d)",
                        m->model_type);
    if (m->n_pieces > (size_t)INT32_MAX / 2)
        return nd_error(ND_ELIMIT, "too many pieces");
    size_t bytes = 0;
    for (size_t i = 0; i < m->n_pieces; i++)
        bytes += m->pieces[i].len;
    nd_tokenizer *t;
    int rc = tok_alloc((int)m->n_pieces, bytes, &t);
    if (rc)
        return rc;
    char *a = t->arena;
    for (size_t i = 0; i < m->n_pieces; i++) {
        memcpy(a, m->pieces[i].piece, m->pieces[i].len);
        a[m->pieces[i].len] = 0;
        t->piece[i] = a;
        t->plen[i] = m->pieces[i].len;
        a += m->pieces[i].len + 1;
        t->score[i] = m->pieces[i].score;
        t->type[i] = (uint8_t)m->pieces[i].type;
    }
    t->bos_id = m->bos_id;
    t->eos_id = m->eos_id;
    t->pad_id = m->pad_id;
    t->byte_fallback = m->byte_fallback;
    t->add_dummy_prefix = m->normalizer.add_dummy_prefix;
    t->remove_extra_ws = m->normalizer.remove_extra_whitespaces;
    t->escape_ws = m->normalizer.escape_whitespaces;
    t->ws_as_suffix = m->treat_whitespace_as_suffix;
    t->unk_surface = strdup(m->unk_surface ? m->unk_surface : " \xE2\x81\x87 ");
    if (!t->unk_surface)
        rc = nd_error(ND_ENOMEM, "out of memory");
    if (!rc && m->normalizer.charsmap)
        rc = load_charsmap(t, m->normalizer.charsmap, m->normalizer.charsmap_len);
    if (!rc)
        rc = tok_finish(t, 1);
    if (rc) {
        nd_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int nd_tokenizer_from_blob(const unsigned char *blob, size_t len, nd_tokenizer **out)
{
    *out = NULL;
    if (len < BLOB_HDR)
        return nd_error(ND_EFORMAT, "tokenizer blob is %zu bytes, shorter than its header", len);
    uint32_t n = rd32(blob);
    if (n == 0 || n > (len - BLOB_HDR) / BLOB_REC)
        return nd_error(ND_EFORMAT, "tokenizer blob claims %u pieces in %zu bytes", n, len);
    nd_tokenizer *t;
    int rc = tok_alloc((int)n, len, &t);
    if (rc)
        return rc;
    t->pad_id = (int32_t)rd32(blob + 4);
    t->eos_id = (int32_t)rd32(blob + 8);
    t->bos_id = (int32_t)rd32(blob + 12);
    t->unk_id = (int32_t)rd32(blob + 16);
    t->add_dummy_prefix = blob[20] != 0;
    t->byte_fallback = blob[21] != 0;
    t->escape_ws = 1;
    static const uint8_t tmap[5] = {ND_SPM_NORMAL, ND_SPM_UNKNOWN, ND_SPM_CONTROL,
                                    ND_SPM_USER_DEFINED, ND_SPM_BYTE};
    size_t off = BLOB_HDR;
    char *a = t->arena;
    for (uint32_t i = 0; i < n && !rc; i++) {
        if (len - off < BLOB_REC) {
            rc = nd_error(ND_EFORMAT, "tokenizer blob truncated in piece %u (byte %zu)", i, off);
            break;
        }
        uint32_t sb = rd32(blob + off);
        memcpy(&t->score[i], &sb, 4);
        uint8_t ty = blob[off + 4];
        size_t pl = (size_t)blob[off + 5] | (size_t)blob[off + 6] << 8;
        off += BLOB_REC;
        if (ty > 4)
            rc = nd_error(ND_EFORMAT, "piece %u has unknown type %u (byte %zu)", i, ty, off - 3);
        else if (pl > len - off)
            rc = nd_error(ND_EFORMAT, "piece %u (%zu bytes) runs past the blob end (byte %zu)", i,
                          pl, off);
        if (rc)
            break;
        t->type[i] = tmap[ty];
        memcpy(a, blob + off, pl);
        a[pl] = 0;
        t->piece[i] = a;
        t->plen[i] = (uint32_t)pl;
        a += pl + 1;
        off += pl;
    }
    if (!rc && off != len)
        rc =
            nd_error(ND_EFORMAT, "%zu trailing bytes after the tokenizer blob's pieces", len - off);
    if (!rc)
        rc = tok_finish(t, 0);
    if (rc) {
        nd_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int nd_tokenizer_load(const char *path, nd_tokenizer **out)
{
    unsigned char *buf;
    size_t len;
    *out = NULL;
    int rc = nd_read_file(path, (size_t)1 << 30, &buf, &len);
    if (rc)
        return rc;
    /* A blob parses only if its piece records consume the file exactly,
     * which a protobuf essentially never does. */
    rc = nd_tokenizer_from_blob(buf, len, out);
    if (rc) {
        nd_spm_model m;
        rc = nd_spm_model_parse(buf, len, &m);
        if (!rc) {
            rc = nd_tokenizer_from_spm(&m, out);
            nd_spm_model_free(&m);
        }
    }
    free(buf);
    if (rc)
        return nd_error_prefix(rc, "%s", path);
    return 0;
}

static void wr32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

int nd_tokenizer_write_blob(const nd_tokenizer *t, unsigned char **blob, size_t *len)
{
    return nd_tokenizer_write_blob_gen(t, 2, blob, len);
}

int nd_tokenizer_write_blob_gen(const nd_tokenizer *t, int generation, unsigned char **blob,
                                size_t *len)
{
    if (generation != 2 && generation != 3)
        return nd_error(ND_EARG, "unknown model generation %d (2 or 3)", generation);
    size_t n_markers = generation == 3 ? sizeof chat_markers / sizeof *chat_markers : N_MARKERS_V2;
    size_t total = BLOB_HDR;
    for (int i = 0; i < t->n; i++) {
        if (t->plen[i] > 0xffff)
            return nd_error(ND_ELIMIT, "piece %d is %u bytes; the blob stores at most 65535", i,
                            t->plen[i]);
        total += BLOB_REC + t->plen[i];
    }
    unsigned char *b = malloc(total), *p = b + BLOB_HDR;
    if (!b)
        return nd_error(ND_ENOMEM, "out of memory for the tokenizer blob");
    wr32(b, (uint32_t)t->n);
    /* 3.x's exporter writes its fixed PAD/EOS/BOS/UNK = 0/1/2/3 */
    wr32(b + 4, generation == 3 ? 0u : (uint32_t)t->pad_id);
    wr32(b + 8, generation == 3 ? 1u : (uint32_t)t->eos_id);
    wr32(b + 12, generation == 3 ? 2u : (uint32_t)t->bos_id);
    wr32(b + 16, generation == 3 ? 3u : (uint32_t)t->unk_id);
    b[20] = (unsigned char)(t->add_dummy_prefix != 0);
    b[21] = (unsigned char)(t->byte_fallback != 0);
    b[22] = b[23] = 0;
    for (int i = 0; i < t->n; i++) {
        /* Upstream's classification order: control, unknown, byte, marker. */
        uint8_t ty = ND_TK_NORMAL;
        if (t->type[i] == ND_SPM_CONTROL)
            ty = ND_TK_CONTROL;
        else if (t->type[i] == ND_SPM_UNKNOWN)
            ty = ND_TK_UNKNOWN;
        else if (t->type[i] == ND_SPM_BYTE)
            ty = ND_TK_BYTE;
        else
            for (size_t k = 0; k < n_markers; k++)
                if (strlen(chat_markers[k]) == t->plen[i] &&
                    !memcmp(chat_markers[k], t->piece[i], t->plen[i]))
                    ty = ND_TK_USER_DEFINED;
        uint32_t sb;
        memcpy(&sb, &t->score[i], 4);
        wr32(p, sb);
        p[4] = ty;
        p[5] = (unsigned char)(t->plen[i] & 0xff);
        p[6] = (unsigned char)(t->plen[i] >> 8);
        memcpy(p + BLOB_REC, t->piece[i], t->plen[i]);
        p += BLOB_REC + t->plen[i];
    }
    *blob = b;
    *len = total;
    return 0;
}

/* ---- accessors ---- */

int nd_tokenizer_vocab_size(const nd_tokenizer *t)
{
    return t->n;
}
int nd_tokenizer_pad_id(const nd_tokenizer *t)
{
    return t->pad_id;
}
int nd_tokenizer_eos_id(const nd_tokenizer *t)
{
    return t->eos_id;
}
int nd_tokenizer_bos_id(const nd_tokenizer *t)
{
    return t->bos_id;
}
int nd_tokenizer_unk_id(const nd_tokenizer *t)
{
    return t->unk_id;
}

const char *nd_tokenizer_piece(const nd_tokenizer *t, int id, size_t *len)
{
    if (id < 0 || id >= t->n)
        return NULL;
    if (len)
        *len = t->plen[id];
    return t->piece[id];
}

float nd_tokenizer_score(const nd_tokenizer *t, int id)
{
    return id >= 0 && id < t->n ? t->score[id] : 0.0f;
}

int nd_tokenizer_type(const nd_tokenizer *t, int id)
{
    return id >= 0 && id < t->n ? t->type[id] : -1;
}

int nd_tokenizer_piece_to_id(const nd_tokenizer *t, const char *s, size_t len)
{
    int id = nd_piece_map_find(t, &t->reserved, s, len);
    if (id < 0)
        id = nd_piece_map_find(t, &t->normal, s, len);
    return id < 0 ? t->unk_id : id;
}

/* ---- decode ---- */

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return nd_error(ND_ENOMEM, "out of memory decoding");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* Length of one valid UTF-8 character at s (as SentencePiece validates:
 * no overlongs, no surrogates, <= U+10FFFF), or 0 if invalid. */
size_t nd_utf8_valid_len(const unsigned char *s, size_t n);

/* Emit a run of byte-piece bytes: valid characters as-is, each invalid byte
 * as U+FFFD. */
static int flush_bytes(sbuf *out, const unsigned char *b, size_t n)
{
    size_t i = 0;
    int rc = 0;
    while (i < n && !rc) {
        size_t l = nd_utf8_valid_len(b + i, n - i);
        if (!l) {
            rc = sb_put(out, "\xEF\xBF\xBD", 3);
            i++;
        } else {
            rc = sb_put(out, (const char *)b + i, l);
            i += l;
        }
    }
    return rc;
}

int nd_tokenizer_decode(const nd_tokenizer *t, const int32_t *ids, size_t n, char **text,
                        size_t *len)
{
    sbuf out = {0}, bytes = {0};
    int rc = sb_put(&out, "", 0), bos_ws = 1, bos_ws_seen = 0;
    for (size_t i = 0; i <= n && !rc; i++) {
        int id = i < n ? ids[i] : -1;
        if (i < n && (id < 0 || id >= t->n)) {
            rc = nd_error(ND_EARG, "invalid token id %d (vocab size %d)", id, t->n);
            break;
        }
        if (i < n && t->type[id] == ND_SPM_BYTE) {
            unsigned char b = (unsigned char)piece_to_byte(t->piece[id], t->plen[id]);
            rc = sb_put(&bytes, (const char *)&b, 1);
            continue;
        }
        if (bytes.n) {
            rc = flush_bytes(&out, (const unsigned char *)bytes.p, bytes.n);
            bytes.n = 0;
        }
        if (i == n || rc)
            break;
        if (bos_ws_seen || out.n)
            bos_ws = 0;
        bos_ws_seen = 0;
        if (t->type[id] == ND_SPM_CONTROL)
            continue;
        if (t->type[id] == ND_SPM_UNKNOWN) {
            rc = sb_put(&out, t->unk_surface, strlen(t->unk_surface));
            continue;
        }
        const char *p = t->piece[id];
        size_t pl = t->plen[id];
        /* Only the first visible piece loses its leading U+2581. */
        if (bos_ws && (t->add_dummy_prefix || t->remove_extra_ws) && pl >= 3 &&
            !memcmp(p, "\xE2\x96\x81", 3)) {
            p += 3;
            pl -= 3;
            bos_ws_seen = !t->remove_extra_ws;
        }
        while (pl && !rc) {
            size_t k = 0;
            while (k + 3 <= pl && memcmp(p + k, "\xE2\x96\x81", 3))
                k++;
            const char *m = k + 3 <= pl ? p + k : NULL;
            if (!m)
                k = pl;
            rc = sb_put(&out, p, k);
            if (m && !rc)
                rc = sb_put(&out, " ", 1);
            k += m ? 3 : 0;
            p += k;
            pl -= k;
        }
    }
    free(bytes.p);
    if (rc) {
        free(out.p);
        return rc;
    }
    *text = out.p;
    if (len)
        *len = out.n;
    return 0;
}

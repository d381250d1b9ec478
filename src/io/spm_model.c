/* Hand-written protobuf wire decoding for SentencePiece's ModelProto. */
#include "io/spm_model.h"

#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/status.h"

/* Protobuf wire types. Groups (3, 4) are obsolete and never appear in
 * SentencePiece files, so they are rejected rather than skipped. */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

#define MAX_PIECES (1u << 24)
#define MAX_DEPTH 8

typedef struct {
    const unsigned char *base; /* start of the whole file, for offsets */
    char *arena;               /* strings are copied here, NUL-terminated */
    size_t arena_used, arena_cap;
    nd_spm_model *m;
    size_t pieces_cap;
} parser;

typedef struct {
    const unsigned char *p, *end;
} span;

static size_t off(const parser *ps, const unsigned char *p)
{
    return (size_t)(p - ps->base);
}

static int read_varint(const parser *ps, span *s, uint64_t *v)
{
    uint64_t r = 0;
    const unsigned char *start = s->p;
    for (int shift = 0; shift < 70; shift += 7) {
        if (s->p >= s->end)
            return nd_error(ND_EFORMAT, "truncated varint at byte %zu", off(ps, start));
        unsigned char b = *s->p++;
        r |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 63);
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return nd_error(ND_EFORMAT, "varint longer than 10 bytes at byte %zu", off(ps, start));
}

/* Read one field's key; *fno = 0 at the end of the span. */
static int read_key(const parser *ps, span *s, uint32_t *fno, int *wt)
{
    if (s->p >= s->end) {
        *fno = 0;
        return 0;
    }
    const unsigned char *at = s->p;
    uint64_t k = 0;
    int rc = read_varint(ps, s, &k);
    if (rc)
        return rc;
    if ((k >> 3) == 0 || (k >> 3) > 0x1fffffff)
        return nd_error(ND_EFORMAT, "invalid field number at byte %zu", off(ps, at));
    *fno = (uint32_t)(k >> 3);
    *wt = (int)(k & 7);
    return 0;
}

static int read_len(const parser *ps, span *s, span *sub)
{
    const unsigned char *at = s->p;
    uint64_t n = 0;
    int rc = read_varint(ps, s, &n);
    if (rc)
        return rc;
    if (n > (uint64_t)(s->end - s->p))
        return nd_error(ND_EFORMAT,
                        "length %llu at byte %zu runs past the end of its message (%zu bytes left)",
                        (unsigned long long)n, off(ps, at), (size_t)(s->end - s->p));
    sub->p = s->p;
    sub->end = s->p + n;
    s->p += n;
    return 0;
}

static int skip_field(const parser *ps, span *s, int wt, uint32_t fno)
{
    const unsigned char *at = s->p;
    uint64_t v = 0;
    span sub = {0, 0};
    switch (wt) {
    case WT_VARINT: return read_varint(ps, s, &v);
    case WT_LEN: return read_len(ps, s, &sub);
    case WT_I64:
    case WT_I32: {
        size_t n = wt == WT_I64 ? 8 : 4;
        if ((size_t)(s->end - s->p) < n)
            return nd_error(ND_EFORMAT, "truncated fixed-width field %u at byte %zu", fno,
                            off(ps, at));
        s->p += n;
        return 0;
    }
    default:
        return nd_error(ND_EFORMAT, "unsupported wire type %d for field %u at byte %zu", wt, fno,
                        off(ps, at));
    }
}

/* Typed readers: each checks the wire type so a hostile file cannot make a
 * length look like a number or vice versa. */
static int expect_wt(const parser *ps, const span *s, int wt, int want, uint32_t fno)
{
    if (wt != want)
        return nd_error(ND_EFORMAT, "field %u has wire type %d, expected %d (near byte %zu)", fno,
                        wt, want, off(ps, s->p));
    return 0;
}

static int get_int(const parser *ps, span *s, int wt, uint32_t fno, int *out)
{
    uint64_t v = 0;
    int rc = expect_wt(ps, s, wt, WT_VARINT, fno);
    if (!rc)
        rc = read_varint(ps, s, &v);
    if (!rc)
        *out = (int)(int32_t)(uint32_t)v; /* int32 semantics: negatives are 10-byte varints */
    return rc;
}

static int get_bool(const parser *ps, span *s, int wt, uint32_t fno, int *out)
{
    uint64_t v = 0;
    int rc = expect_wt(ps, s, wt, WT_VARINT, fno);
    if (!rc)
        rc = read_varint(ps, s, &v);
    if (!rc)
        *out = v != 0;
    return rc;
}

static int get_float(const parser *ps, span *s, int wt, uint32_t fno, float *out)
{
    int rc = expect_wt(ps, s, wt, WT_I32, fno);
    if (rc)
        return rc;
    if (s->end - s->p < 4)
        return nd_error(ND_EFORMAT, "truncated float field %u at byte %zu", fno, off(ps, s->p));
    uint32_t u = (uint32_t)s->p[0] | (uint32_t)s->p[1] << 8 | (uint32_t)s->p[2] << 16 |
                 (uint32_t)s->p[3] << 24;
    memcpy(out, &u, 4);
    s->p += 4;
    return 0;
}

/* Copy a length-delimited field into the arena (NUL-terminated). */
static int get_bytes(parser *ps, span *s, int wt, uint32_t fno, const char **out, size_t *len)
{
    span sub = {0, 0};
    int rc = expect_wt(ps, s, wt, WT_LEN, fno);
    if (!rc)
        rc = read_len(ps, s, &sub);
    if (rc)
        return rc;
    size_t n = (size_t)(sub.end - sub.p);
    /* Every string costs at least 2 input bytes (key + length), so the
     * arena sized at input length + 1 cannot overflow; checked anyway. */
    if (n + 1 > ps->arena_cap - ps->arena_used)
        return nd_error(ND_ELIMIT, "string arena exhausted at byte %zu", off(ps, sub.p));
    char *dst = ps->arena + ps->arena_used;
    if (n)
        memcpy(dst, sub.p, n);
    dst[n] = 0;
    ps->arena_used += n + 1;
    *out = dst;
    if (len)
        *len = n;
    return 0;
}

static int parse_piece(parser *ps, span s)
{
    nd_spm_model *m = ps->m;
    if (m->n_pieces == ps->pieces_cap) {
        if (m->n_pieces >= MAX_PIECES)
            return nd_error(ND_ELIMIT, "more than %u pieces", MAX_PIECES);
        size_t cap = ps->pieces_cap ? ps->pieces_cap * 2 : 1024;
        nd_spm_piece *np = realloc(m->pieces, cap * sizeof *np);
        if (!np)
            return nd_error(ND_ENOMEM, "out of memory for %zu pieces", cap);
        m->pieces = np;
        ps->pieces_cap = cap;
    }
    nd_spm_piece *pc = &m->pieces[m->n_pieces];
    pc->piece = "";
    pc->len = 0;
    pc->score = 0.0f;
    pc->type = ND_SPM_NORMAL;
    const unsigned char *start = s.p;
    for (;;) {
        uint32_t fno = 0;
        int wt = 0, rc = read_key(ps, &s, &fno, &wt);
        if (rc)
            return rc;
        if (!fno)
            break;
        if (fno == 1) {
            size_t n;
            rc = get_bytes(ps, &s, wt, fno, &pc->piece, &n);
            if (!rc && n > UINT32_MAX)
                rc = nd_error(ND_ELIMIT, "piece too long at byte %zu", off(ps, start));
            pc->len = (uint32_t)n;
        } else if (fno == 2) {
            rc = get_float(ps, &s, wt, fno, &pc->score);
        } else if (fno == 3) {
            rc = get_int(ps, &s, wt, fno, &pc->type);
            if (!rc && (pc->type < ND_SPM_NORMAL || pc->type > ND_SPM_BYTE))
                rc = nd_error(ND_EFORMAT, "piece %zu has unknown type %d (message at byte %zu)",
                              m->n_pieces, pc->type, off(ps, start));
        } else {
            rc = skip_field(ps, &s, wt, fno);
        }
        if (rc)
            return rc;
    }
    m->n_pieces++;
    return 0;
}

static int parse_trainer(parser *ps, span s)
{
    nd_spm_model *m = ps->m;
    for (;;) {
        uint32_t fno = 0;
        int wt = 0, rc = read_key(ps, &s, &fno, &wt);
        if (rc)
            return rc;
        if (!fno)
            return 0;
        switch (fno) {
        case 3: rc = get_int(ps, &s, wt, fno, &m->model_type); break;
        case 4: rc = get_int(ps, &s, wt, fno, &m->vocab_size); break;
        case 24: rc = get_bool(ps, &s, wt, fno, &m->treat_whitespace_as_suffix); break;
        case 35: rc = get_bool(ps, &s, wt, fno, &m->byte_fallback); break;
        case 40: rc = get_int(ps, &s, wt, fno, &m->unk_id); break;
        case 41: rc = get_int(ps, &s, wt, fno, &m->bos_id); break;
        case 42: rc = get_int(ps, &s, wt, fno, &m->eos_id); break;
        case 43: rc = get_int(ps, &s, wt, fno, &m->pad_id); break;
        case 44: rc = get_bytes(ps, &s, wt, fno, &m->unk_surface, NULL); break;
        default: rc = skip_field(ps, &s, wt, fno); break;
        }
        if (rc)
            return rc;
    }
}

static int parse_normalizer(parser *ps, span s, nd_spm_normalizer *n)
{
    n->present = 1;
    for (;;) {
        uint32_t fno = 0;
        int wt = 0, rc = read_key(ps, &s, &fno, &wt);
        if (rc)
            return rc;
        if (!fno)
            return 0;
        switch (fno) {
        case 1: rc = get_bytes(ps, &s, wt, fno, &n->name, NULL); break;
        case 2: {
            const char *p;
            rc = get_bytes(ps, &s, wt, fno, &p, &n->charsmap_len);
            n->charsmap = rc || !n->charsmap_len ? NULL : (const unsigned char *)p;
            break;
        }
        case 3: rc = get_bool(ps, &s, wt, fno, &n->add_dummy_prefix); break;
        case 4: rc = get_bool(ps, &s, wt, fno, &n->remove_extra_whitespaces); break;
        case 5: rc = get_bool(ps, &s, wt, fno, &n->escape_whitespaces); break;
        default: rc = skip_field(ps, &s, wt, fno); break;
        }
        if (rc)
            return rc;
    }
}

static void normalizer_defaults(nd_spm_normalizer *n)
{
    memset(n, 0, sizeof *n);
    n->name = "";
    n->add_dummy_prefix = 1;
    n->remove_extra_whitespaces = 1;
    n->escape_whitespaces = 1;
}

int nd_spm_model_parse(const unsigned char *data, size_t len, nd_spm_model *out)
{
    memset(out, 0, sizeof *out);
    if (!data && len)
        return nd_error(ND_EARG, "NULL model data");
    nd_spm_model m;
    memset(&m, 0, sizeof m);
    m.model_type = ND_SPM_UNIGRAM;
    m.vocab_size = 8000;
    m.unk_id = 0;
    m.bos_id = 1;
    m.eos_id = 2;
    m.pad_id = -1;
    m.unk_surface = " \xE2\x81\x87 ";
    normalizer_defaults(&m.normalizer);
    normalizer_defaults(&m.denormalizer);
    m.arena = malloc(len + 1);
    if (!m.arena)
        return nd_error(ND_ENOMEM, "out of memory for a %zu-byte model", len);

    parser ps = {data, m.arena, 0, len + 1, &m, 0};
    span s = {data, data + len};
    int rc = 0;
    for (;;) {
        uint32_t fno = 0;
        int wt = 0;
        span sub = {0, 0};
        if ((rc = read_key(&ps, &s, &fno, &wt)) != 0 || !fno)
            break;
        if (fno >= 1 && fno <= 5 && fno != 4) {
            const unsigned char *at = s.p;
            if ((rc = expect_wt(&ps, &s, wt, WT_LEN, fno)) || (rc = read_len(&ps, &s, &sub)))
                break;
            if (fno == 1)
                rc = parse_piece(&ps, sub);
            else if (fno == 2)
                rc = parse_trainer(&ps, sub);
            else
                rc = parse_normalizer(&ps, sub, fno == 3 ? &m.normalizer : &m.denormalizer);
            if (rc) {
                nd_error_prefix(rc, "in %s at byte %zu",
                                fno == 1   ? "a piece"
                                : fno == 2 ? "trainer_spec"
                                           : "normalizer_spec",
                                off(&ps, at));
                break;
            }
        } else if ((rc = skip_field(&ps, &s, wt, fno)) != 0) {
            break;
        }
    }
    if (!rc && m.n_pieces == 0)
        rc = nd_error(ND_EFORMAT, "model has no pieces (not a SentencePiece model?)");
    if (rc) {
        nd_spm_model_free(&m);
        return rc;
    }
    *out = m;
    return 0;
}

int nd_spm_model_load(const char *path, nd_spm_model *out)
{
    unsigned char *buf;
    size_t len;
    memset(out, 0, sizeof *out);
    int rc = nd_read_file(path, (size_t)1 << 30, &buf, &len);
    if (rc)
        return rc;
    rc = nd_spm_model_parse(buf, len, out);
    free(buf);
    if (rc)
        return nd_error_prefix(rc, "%s", path);
    return 0;
}

void nd_spm_model_free(nd_spm_model *m)
{
    if (!m)
        return;
    free(m->pieces);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

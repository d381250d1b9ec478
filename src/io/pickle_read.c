/* A pickle virtual machine that only builds data: globals are looked up in
 * a fixed whitelist and REDUCE/BUILD/NEWOBJ are interpreted for those few
 * numpy/codecs callables, never executed.
 *
 * Hostile-input rules: every length is checked against the bytes left
 * before allocating; containers become immutable once placed inside
 * another container (Python's pickler never does otherwise for acyclic
 * data), which rules out reference cycles and keeps nesting depth exact. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/status.h"
#include "io/pickle_internal.h"

typedef struct {
    const unsigned char *p;
    size_t len, pos;
    const char *what;
    size_t op_pos;
    int op;
    pv **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    pv **memo;
    size_t nmemo, memocap;
    size_t nobjs;
    size_t derived, derived_cap;
    pk_env env;
} rd;

static const char *op_name(int op)
{
    switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    }
    return "unknown";
}

__attribute__((format(printf, 3, 4))) static int fail(void *ctx, int code, const char *fmt, ...)
{
    rd *r = ctx;
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->op < 0)
        return nd_error(code, "%s: offset %zu: %s", r->what, r->op_pos, msg);
    return nd_error(code, "%s: offset %zu: opcode %s (0x%02x): %s", r->what, r->op_pos,
                    op_name(r->op), r->op, msg);
}

/* ---- input ---- */

static int need(rd *r, size_t n)
{
    if (n > r->len - r->pos)
        return fail(r, ND_EFORMAT, "truncated: needs %zu more bytes, %zu left", n, r->len - r->pos);
    return 0;
}

static uint64_t rd_le(rd *r, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)r->p[r->pos + i] << (8 * i);
    r->pos += n;
    return v;
}

/* A text line ending in '\n' (protocol 0 style arguments). */
static int read_line(rd *r, const char **s, size_t *n)
{
    const unsigned char *start = r->p + r->pos;
    const unsigned char *nl = memchr(start, '\n', r->len - r->pos);
    if (!nl)
        return fail(r, ND_EFORMAT, "truncated: no newline ends the argument");
    *s = (const char *)start;
    *n = (size_t)(nl - start);
    r->pos += *n + 1;
    return 0;
}

static int parse_decimal(rd *r, const char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (n && (s[0] == '-' || s[0] == '+')) {
        neg = s[0] == '-';
        i++;
    }
    if (i == n)
        return fail(r, ND_EFORMAT, "empty integer");
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return fail(r, ND_EFORMAT, "bad digit in integer '%.*s'", (int)(n < 40 ? n : 40), s);
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (lim - d) / 10)
            return fail(r, ND_ELIMIT, "integer '%.*s' does not fit in 64 bits",
                        (int)(n < 40 ? n : 40), s);
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* ---- stack and memo ---- */

static size_t mark_base(const rd *r)
{
    return r->nmarks ? r->marks[r->nmarks - 1] : 0;
}

static int push_ref(rd *r, pv *v)
{
    if (r->sp == r->scap) {
        size_t ncap = r->scap ? r->scap * 2 : 64;
        pv **s = realloc(r->stack, ncap * sizeof *s);
        if (!s) {
            pv_decref(v);
            return fail(r, ND_ENOMEM, "out of memory growing the stack");
        }
        r->stack = s;
        r->scap = ncap;
    }
    r->stack[r->sp++] = v;
    return 0;
}

/* Push a newly created object (NULL means allocation failed). */
static int push_new(rd *r, pv *v)
{
    if (!v)
        return fail(r, ND_ENOMEM, "out of memory");
    if (++r->nobjs > PK_MAX_OBJECTS) {
        pv_decref(v);
        return fail(r, ND_ELIMIT, "more than %zu objects", PK_MAX_OBJECTS);
    }
    return push_ref(r, v);
}

/* Require n items above the current mark. */
static int have(rd *r, size_t n)
{
    if (r->sp - mark_base(r) < n)
        return fail(r, ND_EFORMAT, "stack underflow: needs %zu items, has %zu above the mark", n,
                    r->sp - mark_base(r));
    return 0;
}

static pv *pop(rd *r)
{
    return r->stack[--r->sp];
}

static pv *top(rd *r)
{
    return r->stack[r->sp - 1];
}

/* Index of the first item above the innermost mark, popping the mark. */
static int pop_mark(rd *r, size_t *base)
{
    if (!r->nmarks)
        return fail(r, ND_EFORMAT, "no MARK on the stack");
    *base = r->marks[--r->nmarks];
    return 0;
}

static int memo_put(rd *r, uint64_t idx)
{
    if (r->sp == mark_base(r))
        return fail(r, ND_EFORMAT, "memoizing with an empty stack");
    /* Python's picklers number the memo densely; refusing gaps keeps a
     * 5-byte LONG_BINPUT from allocating gigabytes. */
    if (idx > r->nmemo)
        return fail(r, ND_EFORMAT, "memo index %llu skips ahead (memo has %zu entries)",
                    (unsigned long long)idx, r->nmemo);
    if (idx == r->nmemo) {
        if (r->nmemo == r->memocap) {
            size_t ncap = r->memocap ? r->memocap * 2 : 64;
            pv **m = realloc(r->memo, ncap * sizeof *m);
            if (!m)
                return fail(r, ND_ENOMEM, "out of memory growing the memo");
            r->memo = m;
            r->memocap = ncap;
        }
        r->memo[r->nmemo++] = NULL;
    }
    pv_decref(r->memo[idx]);
    r->memo[idx] = pv_incref(top(r));
    return 0;
}

static int memo_get(rd *r, uint64_t idx)
{
    if (idx >= r->nmemo || !r->memo[idx])
        return fail(r, ND_EFORMAT, "memo index %llu not defined (memo has %zu entries)",
                    (unsigned long long)idx, r->nmemo);
    return push_ref(r, pv_incref(r->memo[idx]));
}

/* ---- containers ---- */

/* Mark `v` as placed inside a container; a dict gets its duplicate keys
 * resolved now that it can no longer change. */
static int freeze(rd *r, pv *v)
{
    pv_box *b = PV_BOX(v);
    if (b->frozen)
        return 0;
    b->frozen = 1;
    if (v->kind == PV_DICT && pv_dict_dedupe(v))
        return fail(r, ND_ENOMEM, "out of memory");
    return 0;
}

static int mutable_target(rd *r, pv *c, int kind)
{
    if ((int)c->kind != kind)
        return fail(r, ND_EFORMAT, "target is %s, expected %s", pv_kind_name(c->kind),
                    pv_kind_name((pv_kind)kind));
    if (PV_BOX(c)->frozen)
        return fail(r, ND_EUNSUPPORTED,
                    "modifying a %s already stored in another container is not supported",
                    pv_kind_name(c->kind));
    return 0;
}

/* Bookkeeping for putting `child` into `parent`; checks before anything
 * is stored so the caller still owns both on failure. */
static int adopt(rd *r, pv *parent, pv *child)
{
    if (parent == child)
        return fail(r, ND_EUNSUPPORTED, "a %s containing itself is not supported",
                    pv_kind_name(parent->kind));
    pv_box *pb = PV_BOX(parent), *cb = PV_BOX(child);
    /* reader-only objects (globals, dtypes) may only sit in the argument
     * tuples that REDUCE/BUILD consume */
    if (cb->opaque && parent->kind != PV_TUPLE)
        return fail(r, ND_EUNSUPPORTED, "cannot store %s in a %s", pv_kind_name(child->kind),
                    pv_kind_name(parent->kind));
    if (cb->depth + 1 > PK_MAX_DEPTH)
        return fail(r, ND_ELIMIT, "containers nested deeper than %d", PK_MAX_DEPTH);
    int rc = freeze(r, child);
    if (rc)
        return rc;
    if (cb->depth + 1 > pb->depth)
        pb->depth = (uint16_t)(cb->depth + 1);
    pb->opaque |= cb->opaque;
    return 0;
}

/* Move stack[base..sp) into a new tuple or list and push it. */
static int collect(rd *r, size_t base, int kind)
{
    pv *c = kind == PV_LIST ? pv_list() : pv_tuple();
    if (!c)
        return fail(r, ND_ENOMEM, "out of memory");
    size_t n = r->sp - base;
    if (n) {
        c->u.seq.items = malloc(n * sizeof(pv *));
        if (!c->u.seq.items) {
            pv_decref(c);
            return fail(r, ND_ENOMEM, "out of memory");
        }
        c->u.seq.cap = n;
    }
    for (size_t i = base; i < r->sp; i++) {
        int rc = adopt(r, c, r->stack[i]);
        if (rc) {
            pv_decref(c);
            return rc; /* items not yet moved stay on the stack and are freed later */
        }
        c->u.seq.items[c->u.seq.n++] = r->stack[i];
        r->stack[i] = NULL;
    }
    r->sp = base;
    return push_new(r, c);
}

/* Append stack[base..sp) to the list at stack[base-1]. */
static int extend_list(rd *r, size_t base)
{
    if (base == 0 || base - 1 < mark_base(r))
        return fail(r, ND_EFORMAT, "stack underflow: no list below the items");
    pv *list = r->stack[base - 1];
    int rc = mutable_target(r, list, PV_LIST);
    if (rc)
        return rc;
    for (size_t i = base; i < r->sp; i++) {
        pv *it = r->stack[i];
        if ((rc = adopt(r, list, it)))
            return rc;
        r->stack[i] = NULL;
        if (pv_seq_push(list, it))
            return fail(r, ND_ENOMEM, "out of memory");
    }
    r->sp = base;
    return 0;
}

static int dict_add_pairs(rd *r, pv *dict, size_t base)
{
    if ((r->sp - base) % 2)
        return fail(r, ND_EFORMAT, "odd number of items (%zu) for dict key/value pairs",
                    r->sp - base);
    for (size_t i = base; i < r->sp; i += 2) {
        pv *k = r->stack[i], *v = r->stack[i + 1];
        if (k->kind != PV_STR && k->kind != PV_INT)
            return fail(r, ND_EUNSUPPORTED, "dict key of type %s not supported (str or int only)",
                        pv_kind_name(k->kind));
        int rc = adopt(r, dict, k);
        if (!rc)
            rc = adopt(r, dict, v);
        if (rc)
            return rc;
        r->stack[i] = r->stack[i + 1] = NULL;
        if (pv_dict_push(dict, k, v))
            return fail(r, ND_ENOMEM, "out of memory");
    }
    return 0;
}

/* Drop stack entries from `base` up (some may be NULL after a move). */
static void truncate_to(rd *r, size_t base)
{
    while (r->sp > base)
        pv_decref(r->stack[--r->sp]);
}

/* ---- globals and calls ---- */

static const struct {
    const char *module, *name;
    pk_global id;
} whitelist[] = {
    {"numpy.core.multiarray", "_reconstruct", PKG_RECONSTRUCT},
    {"numpy._core.multiarray", "_reconstruct", PKG_RECONSTRUCT},
    {"numpy.core.multiarray", "scalar", PKG_SCALAR},
    {"numpy._core.multiarray", "scalar", PKG_SCALAR},
    {"numpy.core.numeric", "_frombuffer", PKG_FROMBUFFER},
    {"numpy._core.numeric", "_frombuffer", PKG_FROMBUFFER},
    {"numpy", "ndarray", PKG_NDARRAY},
    {"numpy", "dtype", PKG_DTYPE},
    {"_codecs", "encode", PKG_CODECS_ENCODE},
    /* protocol 2 spells b'' as bytes(); only the no-argument call is run */
    {"__builtin__", "bytes", PKG_BYTES},
    {"builtins", "bytes", PKG_BYTES},
};

static int lookup_global(rd *r, const char *mod, size_t mlen, const char *name, size_t nlen)
{
    for (size_t i = 0; i < sizeof whitelist / sizeof whitelist[0]; i++) {
        if (strlen(whitelist[i].module) == mlen && strlen(whitelist[i].name) == nlen &&
            memcmp(whitelist[i].module, mod, mlen) == 0 &&
            memcmp(whitelist[i].name, name, nlen) == 0) {
            pv *g = pv_new_kind(PVX_GLOBAL);
            if (g)
                g->u.i = whitelist[i].id;
            return push_new(r, g);
        }
    }
    int ml = mlen > 100 ? 100 : (int)mlen, nl = nlen > 100 ? 100 : (int)nlen;
    return fail(r, ND_EUNSAFE, "refusing global %.*s.%.*s (not in the numpy whitelist)", ml, mod,
                nl, name);
}

static int call(rd *r, pv *fn, pv *args, pv **out)
{
    *out = NULL;
    if ((int)fn->kind != PVX_GLOBAL)
        return fail(r, ND_EFORMAT, "calling a %s", pv_kind_name(fn->kind));
    if (args->kind != PV_TUPLE)
        return fail(r, ND_EFORMAT, "call arguments are a %s, not a tuple",
                    pv_kind_name(args->kind));
    switch ((pk_global)fn->u.i) {
    case PKG_RECONSTRUCT: {
        if (args->u.seq.n != 3 || (int)args->u.seq.items[0]->kind != PVX_GLOBAL ||
            args->u.seq.items[0]->u.i != PKG_NDARRAY)
            return fail(r, ND_EUNSUPPORTED, "_reconstruct is only accepted for numpy.ndarray");
        *out = pv_new_kind(PVX_RECON);
        return *out ? 0 : fail(r, ND_ENOMEM, "out of memory");
    }
    case PKG_DTYPE: {
        pv *dt = pv_new_kind(PVX_DTYPE);
        if (!dt)
            return fail(r, ND_ENOMEM, "out of memory");
        int rc = pk_dtype_from_args(&r->env, args, dt);
        if (rc) {
            pv_decref(dt);
            return rc;
        }
        *out = dt;
        return 0;
    }
    case PKG_FROMBUFFER: return pk_frombuffer(&r->env, args, out);
    case PKG_SCALAR: return pk_scalar(&r->env, args, out);
    case PKG_CODECS_ENCODE: return pk_codecs_encode(&r->env, args, out);
    case PKG_BYTES:
        if (args->u.seq.n != 0)
            return fail(r, ND_EUNSAFE, "builtins.bytes is only accepted with no arguments");
        *out = pv_bytes("", 0);
        return *out ? 0 : fail(r, ND_ENOMEM, "out of memory");
    case PKG_NDARRAY: return fail(r, ND_EUNSUPPORTED, "calling numpy.ndarray directly");
    }
    return fail(r, ND_EFORMAT, "bad global");
}

static int op_reduce(rd *r)
{
    int rc = have(r, 2);
    if (rc)
        return rc;
    pv *args = r->stack[r->sp - 1], *fn = r->stack[r->sp - 2], *res;
    if ((rc = call(r, fn, args, &res)))
        return rc;
    truncate_to(r, r->sp - 2);
    return push_new(r, res);
}

static int op_build(rd *r)
{
    int rc = have(r, 2);
    if (rc)
        return rc;
    pv *state = r->stack[r->sp - 1], *obj = r->stack[r->sp - 2];
    if ((int)obj->kind != PVX_DTYPE && (int)obj->kind != PVX_RECON)
        return fail(r, ND_EUNSUPPORTED, "BUILD on a %s is not supported", pv_kind_name(obj->kind));
    if (PV_BOX(obj)->frozen)
        return fail(r, ND_EUNSUPPORTED, "BUILD on a %s already stored elsewhere",
                    pv_kind_name(obj->kind));
    if ((int)obj->kind == PVX_DTYPE)
        rc = pk_dtype_setstate(&r->env, obj, state);
    else
        rc = pk_array_setstate(&r->env, obj, state);
    if (rc)
        return rc;
    truncate_to(r, r->sp - 1);
    return 0;
}

/* ---- scalars ---- */

static int op_long(rd *r, size_t n)
{
    if (need(r, n))
        return ND_EFORMAT;
    const unsigned char *b = r->p + r->pos;
    /* accept any length whose high bytes are only sign extension */
    if (n > 8) {
        unsigned char ext = (b[7] & 0x80) ? 0xff : 0x00;
        for (size_t i = 8; i < n; i++)
            if (b[i] != ext)
                return fail(r, ND_ELIMIT, "integer of %zu bytes does not fit in 64 bits", n);
    }
    uint64_t v = 0;
    size_t m = n < 8 ? n : 8;
    for (size_t i = 0; i < m; i++)
        v |= (uint64_t)b[i] << (8 * i);
    if (m && m < 8 && (b[m - 1] & 0x80))
        v |= ~(uint64_t)0 << (8 * m);
    r->pos += n;
    int64_t s;
    memcpy(&s, &v, 8);
    return push_new(r, pv_int(s));
}

static int op_string(rd *r, int kind, uint64_t n)
{
    if (n > r->len - r->pos)
        return fail(r, ND_EFORMAT, "truncated: length %llu but %zu bytes left",
                    (unsigned long long)n, r->len - r->pos);
    pv *v = kind == PV_STR ? pv_strn((const char *)r->p + r->pos, (size_t)n)
                           : pv_bytes(r->p + r->pos, (size_t)n);
    r->pos += (size_t)n;
    return push_new(r, v);
}

static int op_binfloat(rd *r)
{
    if (need(r, 8))
        return ND_EFORMAT;
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++)
        bits = bits << 8 | r->p[r->pos + i];
    r->pos += 8;
    double d;
    memcpy(&d, &bits, 8);
    return push_new(r, pv_float(d));
}

static int op_text_int(rd *r, int is_long)
{
    const char *s = NULL;
    size_t n = 0;
    int rc = read_line(r, &s, &n);
    if (rc)
        return rc;
    if (is_long && n && s[n - 1] == 'L')
        n--;
    if (!is_long && n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1'))
        return push_new(r, pv_bool(s[1] == '1'));
    int64_t v;
    if ((rc = parse_decimal(r, s, n, &v)))
        return rc;
    return push_new(r, pv_int(v));
}

static int op_text_memo(rd *r, int put)
{
    const char *s = NULL;
    size_t n = 0;
    int64_t idx;
    int rc = read_line(r, &s, &n);
    if (!rc)
        rc = parse_decimal(r, s, n, &idx);
    if (rc)
        return rc;
    if (idx < 0)
        return fail(r, ND_EFORMAT, "negative memo index");
    return put ? memo_put(r, (uint64_t)idx) : memo_get(r, (uint64_t)idx);
}

static int op_global_text(rd *r)
{
    const char *mod = NULL, *name = NULL;
    size_t ml = 0, nl = 0;
    int rc = read_line(r, &mod, &ml);
    if (!rc)
        rc = read_line(r, &name, &nl);
    return rc ? rc : lookup_global(r, mod, ml, name, nl);
}

static int op_stack_global(rd *r)
{
    int rc = have(r, 2);
    if (rc)
        return rc;
    pv *name = r->stack[r->sp - 1], *mod = r->stack[r->sp - 2];
    if (mod->kind != PV_STR || name->kind != PV_STR)
        return fail(r, ND_EFORMAT, "STACK_GLOBAL needs two str, got %s and %s",
                    pv_kind_name(mod->kind), pv_kind_name(name->kind));
    r->sp -= 2;
    rc = lookup_global(r, mod->u.str.s, mod->u.str.len, name->u.str.s, name->u.str.len);
    pv_decref(mod);
    pv_decref(name);
    return rc;
}

/* MARK: the stack height, for the collecting opcodes to come */
static int op_mark(rd *r)
{
    if (r->nmarks == PK_MAX_MARKS)
        return fail(r, ND_ELIMIT, "more than %d nested MARKs", PK_MAX_MARKS);
    if (r->nmarks == r->mcap) {
        size_t ncap = r->mcap ? r->mcap * 2 : 16;
        size_t *m = realloc(r->marks, ncap * sizeof *m);
        if (!m)
            return fail(r, ND_ENOMEM, "out of memory");
        r->marks = m;
        r->mcap = ncap;
    }
    r->marks[r->nmarks++] = r->sp;
    return 0;
}

/* DICT: a new dict of the key, value pairs above the mark */
static int op_dict(rd *r)
{
    size_t base = 0;
    int rc = pop_mark(r, &base);
    if (rc)
        return rc;
    pv *d = pv_dict();
    if (!d)
        return fail(r, ND_ENOMEM, "out of memory");
    rc = dict_add_pairs(r, d, base);
    if (rc) {
        pv_decref(d);
        return rc;
    }
    r->sp = base;
    return push_new(r, d);
}

/* SETITEM ('s': one pair) and SETITEMS ('u': the pairs above the mark)
 * into the dict below them */
static int op_setitems(rd *r, int op)
{
    size_t base = 0;
    int rc;
    if (op == 's') {
        if ((rc = have(r, 3)))
            return rc;
        base = r->sp - 2;
    } else if ((rc = pop_mark(r, &base))) {
        return rc;
    }
    if (base == 0 || base - 1 < mark_base(r))
        return fail(r, ND_EFORMAT, "stack underflow: no dict below the items");
    pv *d = r->stack[base - 1];
    if ((rc = mutable_target(r, d, PV_DICT)) || (rc = dict_add_pairs(r, d, base)))
        return rc;
    r->sp = base;
    return 0;
}

/* INST: refused, naming the class it would instantiate */
static int op_inst(rd *r)
{
    const char *mod = NULL, *name = NULL;
    size_t ml = 0, nl = 0;
    int rc;
    if ((rc = read_line(r, &mod, &ml)) || (rc = read_line(r, &name, &nl)))
        return rc;
    return fail(r, ND_EUNSAFE, "refusing to instantiate %.*s.%.*s", (int)(ml > 100 ? 100 : ml), mod,
                (int)(nl > 100 ? 100 : nl), name);
}

/* ---- the loop ---- */

/* One opcode. This stays one switch (68 case labels, over 150 lines) on
 * purpose: it is the decoder's opcode table, read top to bottom and checked
 * against pickletools' list, each case one line or a few; the work that
 * takes more lives in the op_* functions above. Split into groups, the
 * table would only be scattered over several functions. Every case returns
 * 0 or an error set by fail() (need() and have() call it); *done at STOP. */
static int step(rd *r, int *done)
{
    r->op_pos = r->pos;
    r->op = -1;
    if (r->pos >= r->len)
        return fail(r, ND_EFORMAT, "truncated: input ends before STOP");
    int op = r->op = r->p[r->pos++];
    int rc;
    size_t base = 0;
    switch (op) {
    case 0x80: /* PROTO */
        if (need(r, 1))
            return ND_EFORMAT;
        if (r->p[r->pos] > 5)
            return fail(r, ND_EUNSUPPORTED, "pickle protocol %d not supported (2-5)", r->p[r->pos]);
        r->pos++;
        return 0;
    case 0x95: /* FRAME: only a length hint for buffered readers */
        if (need(r, 8))
            return ND_EFORMAT;
        if (rd_le(r, 8) > r->len - r->pos)
            return fail(r, ND_EFORMAT, "frame extends past the end of the input");
        return 0;
    case '.':
        if (r->nmarks || r->sp != 1)
            return fail(r, ND_EFORMAT, "STOP with %zu stack items and %zu open MARKs", r->sp,
                        r->nmarks);
        *done = 1;
        return 0;
    case '(': return op_mark(r);
    case '0': /* POP; like CPython, an empty frame pops the mark itself */
        if (r->sp > mark_base(r)) {
            pv_decref(pop(r));
            return 0;
        }
        return pop_mark(r, &base);
    case '1':
        if ((rc = pop_mark(r, &base)))
            return rc;
        truncate_to(r, base);
        return 0;
    case '2':
        if ((rc = have(r, 1)))
            return rc;
        return push_ref(r, pv_incref(top(r)));
    case 'N': return push_new(r, pv_none());
    case 0x88: return push_new(r, pv_bool(1));
    case 0x89: return push_new(r, pv_bool(0));
    case 'J':
        if (need(r, 4))
            return ND_EFORMAT;
        return push_new(r, pv_int((int32_t)(uint32_t)rd_le(r, 4)));
    case 'K':
        if (need(r, 1))
            return ND_EFORMAT;
        return push_new(r, pv_int((int64_t)rd_le(r, 1)));
    case 'M':
        if (need(r, 2))
            return ND_EFORMAT;
        return push_new(r, pv_int((int64_t)rd_le(r, 2)));
    case 0x8a:
        if (need(r, 1))
            return ND_EFORMAT;
        return op_long(r, (size_t)rd_le(r, 1));
    case 0x8b: {
        if (need(r, 4))
            return ND_EFORMAT;
        int32_t n = (int32_t)(uint32_t)rd_le(r, 4);
        if (n < 0)
            return fail(r, ND_EFORMAT, "negative LONG4 length");
        return op_long(r, (size_t)n);
    }
    case 'I': return op_text_int(r, 0);
    case 'L': return op_text_int(r, 1);
    case 'G': return op_binfloat(r);
    case 0x8c:
        if (need(r, 1))
            return ND_EFORMAT;
        return op_string(r, PV_STR, rd_le(r, 1));
    case 'X':
        if (need(r, 4))
            return ND_EFORMAT;
        return op_string(r, PV_STR, rd_le(r, 4));
    case 0x8d:
        if (need(r, 8))
            return ND_EFORMAT;
        return op_string(r, PV_STR, rd_le(r, 8));
    case 'C':
        if (need(r, 1))
            return ND_EFORMAT;
        return op_string(r, PV_BYTES, rd_le(r, 1));
    case 'B':
        if (need(r, 4))
            return ND_EFORMAT;
        return op_string(r, PV_BYTES, rd_le(r, 4));
    case 0x8e:
    case 0x96: /* BYTEARRAY8 reads back as bytes */
        if (need(r, 8))
            return ND_EFORMAT;
        return op_string(r, PV_BYTES, rd_le(r, 8));
    case ']': return push_new(r, pv_list());
    case ')': return push_new(r, pv_tuple());
    case '}': return push_new(r, pv_dict());
    case 'l':
    case 't':
        if ((rc = pop_mark(r, &base)))
            return rc;
        return collect(r, base, op == 'l' ? PV_LIST : PV_TUPLE);
    case 0x85:
    case 0x86:
    case 0x87:
        if ((rc = have(r, (size_t)(op - 0x84))))
            return rc;
        return collect(r, r->sp - (size_t)(op - 0x84), PV_TUPLE);
    case 'a':
        if ((rc = have(r, 2)))
            return rc;
        return extend_list(r, r->sp - 1);
    case 'e':
        if ((rc = pop_mark(r, &base)))
            return rc;
        return extend_list(r, base);
    case 'd': return op_dict(r);
    case 's':
    case 'u': return op_setitems(r, op);
    case 'q':
        if (need(r, 1))
            return ND_EFORMAT;
        return memo_put(r, rd_le(r, 1));
    case 'r':
        if (need(r, 4))
            return ND_EFORMAT;
        return memo_put(r, rd_le(r, 4));
    case 0x94: return memo_put(r, r->nmemo);
    case 'h':
        if (need(r, 1))
            return ND_EFORMAT;
        return memo_get(r, rd_le(r, 1));
    case 'j':
        if (need(r, 4))
            return ND_EFORMAT;
        return memo_get(r, rd_le(r, 4));
    case 'p': return op_text_memo(r, 1);
    case 'g': return op_text_memo(r, 0);
    case 'c': return op_global_text(r);
    case 0x93: return op_stack_global(r);
    case 'R': return op_reduce(r);
    case 0x81: /* NEWOBJ cls(*args): only numpy.dtype among whitelisted classes */
        if ((rc = have(r, 2)))
            return rc;
        if ((int)r->stack[r->sp - 2]->kind != PVX_GLOBAL || r->stack[r->sp - 2]->u.i != PKG_DTYPE)
            return fail(r, ND_EUNSUPPORTED, "NEWOBJ is only accepted for numpy.dtype");
        return op_reduce(r);
    case 'b': return op_build(r);
    case 'i': return op_inst(r);
    case 'o': return fail(r, ND_EUNSAFE, "refusing to instantiate an object");
    case 0x82:
    case 0x83:
    case 0x84: return fail(r, ND_EUNSAFE, "refusing a copyreg extension-registry global");
    case 'P':
    case 'Q': return fail(r, ND_EUNSUPPORTED, "persistent ids are not supported");
    case 0x97:
    case 0x98:
        return fail(r, ND_EUNSUPPORTED,
                    "out-of-band buffers are not supported (the data is not in the file)");
    case 0x8f:
    case 0x90:
    case 0x91: return fail(r, ND_EUNSUPPORTED, "sets are not supported");
    case 0x92: return fail(r, ND_EUNSUPPORTED, "NEWOBJ_EX is not supported");
    case 'F':
    case 'S':
    case 'T':
    case 'U':
    case 'V':
        return fail(r, ND_EUNSUPPORTED,
                    "protocol 0/1 text and Python 2 str opcodes are not "
                    "supported");
    }
    return fail(r, ND_EFORMAT, "invalid opcode");
}

int pickle_loads(const void *buf, size_t len, const char *what, pv **out)
{
    *out = NULL;
    rd r;
    memset(&r, 0, sizeof r);
    r.p = buf;
    r.len = len;
    r.what = what ? what : "pickle";
    r.op = -1;
    /* array data must come from the input; allow it twice over (bytes
     * decoded from protocol-2 text, then copied into the array) */
    r.derived_cap = len > (SIZE_MAX - (1u << 20)) / 2 ? SIZE_MAX : 2 * len + (1u << 20);
    r.env.ctx = &r;
    r.env.fail = fail;
    r.env.derived = &r.derived;
    r.env.derived_cap = r.derived_cap;
    if (!buf && len)
        return nd_error(ND_EARG, "%s: NULL buffer", r.what);
    int rc = 0, done = 0;
    while (!rc && !done)
        rc = step(&r, &done);
    if (!rc) {
        pv *v = r.stack[0];
        if (PV_BOX(v)->opaque)
            rc = fail(&r, ND_EUNSUPPORTED, "result is or contains a %s",
                      (int)v->kind >= PVX_GLOBAL ? pv_kind_name(v->kind) : "numpy object");
        else if ((rc = freeze(&r, v)) == 0) {
            *out = v;
            r.sp = 0;
        }
    }
    truncate_to(&r, 0);
    for (size_t i = 0; i < r.nmemo; i++)
        pv_decref(r.memo[i]);
    free(r.stack);
    free(r.marks);
    free(r.memo);
    return rc;
}

int pickle_load_file(const char *path, pv **out)
{
    *out = NULL;
    unsigned char *buf;
    size_t len;
    int rc = nd_read_file(path, 0, &buf, &len);
    if (rc)
        return rc;
    rc = pickle_loads(buf, len, path, out);
    /* the usual mistake is passing some other file: say so first */
    if (rc && (len == 0 || buf[0] != 0x80)) {
        char detail[768];
        snprintf(detail, sizeof detail, "%s", nd_last_error());
        rc = nd_error(rc, "%s is not a pickle file written with protocol 2 or later (%s)", path,
                      detail);
    }
    free(buf);
    return rc;
}

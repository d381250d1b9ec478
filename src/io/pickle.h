/* Python pickle values: a safe reader and a writer.
 *
 * The reader understands protocols 2-5 for the structures upstream needle
 * writes with pickle.dump: dict/list/tuple/str/bytes/int/float/bool/None and
 * numpy ndarrays. It never executes anything: GLOBAL/STACK_GLOBAL are
 * resolved against a fixed whitelist (numpy's _reconstruct, dtype,
 * ndarray, _frombuffer, and the codecs.encode used by protocol-2 bytes),
 * and everything else is refused with ND_EUNSAFE naming the global.
 *
 * Values are reference counted (the pickle memo can share an object). */
#ifndef ND_PICKLE_H
#define ND_PICKLE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PV_NONE,
    PV_BOOL,
    PV_INT,
    PV_FLOAT,
    PV_STR,   /* UTF-8 text, NUL-terminated, len excludes the NUL */
    PV_BYTES, /* raw bytes (also NUL-terminated for convenience) */
    PV_LIST,
    PV_TUPLE,
    PV_DICT, /* keys in insertion order */
    PV_NDARRAY,
} pv_kind;

typedef enum { ND_F16, ND_F32, ND_F64, ND_I32, ND_I64, ND_BOOL } nd_dtype;

#define PV_MAX_NDIM 8

typedef struct pv pv;
struct pv {
    pv_kind kind;
    int refs;
    union {
        int b;       /* PV_BOOL */
        int64_t i;   /* PV_INT (wider ints are refused) */
        double f;    /* PV_FLOAT */
        struct {     /* PV_STR, PV_BYTES */
            char *s;
            size_t len;
        } str;
        struct {     /* PV_LIST, PV_TUPLE */
            pv **items;
            size_t n, cap;
        } seq;
        struct {     /* PV_DICT */
            pv **keys;
            pv **vals;
            size_t n, cap;
        } dict;
        struct {     /* PV_NDARRAY: data is C-order, little-endian */
            nd_dtype dtype;
            int ndim;
            int64_t shape[PV_MAX_NDIM];
            void *data;
            size_t nbytes;
        } nd;
    } u;
};

/* ---- reading ---- */

/* Parse a whole pickle held in memory. On success *out owns a new
 * reference. On failure returns a negative ND_E* code with a message
 * (naming the byte offset and what was wrong). `what` names the source in
 * messages (usually the file path). */
int pickle_loads(const void *buf, size_t len, const char *what, pv **out);

/* Read and parse a file. */
int pickle_load_file(const char *path, pv **out);

/* ---- building and inspecting ---- */
pv *pv_none(void);
pv *pv_bool(int b);
pv *pv_int(int64_t i);
pv *pv_float(double f);
pv *pv_str(const char *s);                    /* copies a NUL-terminated string */
pv *pv_strn(const char *s, size_t len);       /* copies */
pv *pv_bytes(const void *p, size_t len);      /* copies */
pv *pv_list(void);
pv *pv_tuple(void);
pv *pv_dict(void);
/* A new array of the given dtype/shape; if data is NULL it is zero-filled,
 * otherwise `data` (C order) is copied. */
pv *pv_ndarray(nd_dtype dtype, int ndim, const int64_t *shape, const void *data);

/* Append to a list/tuple; steals the reference to `item`. 0 or ND_ENOMEM. */
int pv_append(pv *seq, pv *item);
/* Set dict[key] (string key); replaces an existing key in place. Steals
 * `val`. */
int pv_dict_set(pv *dict, const char *key, pv *val);
/* dict[key] for a string key, or NULL (borrowed). */
pv *pv_dict_get(const pv *dict, const char *key);

/* The same for any key value (compared with pv_equal: a str key may hold
 * NUL bytes, keys may be ints or tuples); set takes a new reference to key
 * and steals val. */
pv *pv_dict_get_key(const pv *dict, const pv *key);
int pv_dict_set_key(pv *dict, const pv *key, pv *val);

pv *pv_incref(pv *v);
void pv_decref(pv *v); /* NULL-safe */

/* Deep equality: same kinds, values, key order; floats compare by bit
 * pattern (so NaN == NaN), arrays by dtype, shape and bytes. */
int pv_equal(const pv *a, const pv *b);
const char *pv_kind_name(pv_kind k); /* "dict", "ndarray", ... */

size_t nd_dtype_size(nd_dtype t);
const char *nd_dtype_name(nd_dtype t); /* "float16", "float32", ... */
int64_t pv_nd_numel(const pv *a);

/* ---- writing ---- */

/* Serialise to pickle protocol 4 (no frames), readable by Python >= 3.4
 * pickle.load with numpy >= 1.x (arrays are written as
 * numpy.core.multiarray._reconstruct + BUILD, the form numpy itself uses).
 * Returns a malloc'd buffer in *out / *out_len. */
int pickle_dumps(const pv *v, unsigned char **out, size_t *out_len);

/* Write atomically: to PATH.tmp.XXXX then rename over PATH. */
int pickle_dump_file(const pv *v, const char *path);

#endif

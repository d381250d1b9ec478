/* Shared between pickle_value.c, pickle_read.c, pickle_numpy.c and
 * pickle_write.c; not part of the public API. */
#ifndef ND_PICKLE_INTERNAL_H
#define ND_PICKLE_INTERNAL_H

#include "io/pickle.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pickle reader/writer assume a little-endian host"
#endif

/* Containers deeper than this are refused by the reader and the writer. */
#define PK_MAX_DEPTH 256
/* Open MARKs; a legitimate pickle needs about one per nesting level. */
#define PK_MAX_MARKS (2 * PK_MAX_DEPTH)
/* Objects one load may create (each costs ~100 bytes). */
#define PK_MAX_OBJECTS ((size_t)1 << 22)

/* Reader-only kinds that never appear in a successful result. They live in
 * pv.kind beyond the public enum; switch on (int)kind. */
enum {
    PVX_GLOBAL = 64, /* a whitelisted callable/class; u.i holds the pk_global id */
    PVX_DTYPE,       /* numpy.dtype instance; see the PVX_DT_* accessors */
    PVX_RECON,       /* ndarray from _reconstruct awaiting its BUILD */
};
#define PVX_DT_TYPE(v) ((v)->u.nd.dtype)
#define PVX_DT_ORDER(v) ((v)->u.nd.ndim) /* '<', '>', '|' or '=' */

typedef enum {
    PKG_RECONSTRUCT,
    PKG_SCALAR,
    PKG_FROMBUFFER,
    PKG_NDARRAY,
    PKG_DTYPE,
    PKG_CODECS_ENCODE,
    PKG_BYTES,
} pk_global;

/* Every pv is allocated as a pv_box so the reader can keep per-object
 * bookkeeping without widening the public struct. */
typedef struct {
    pv v;
    uint16_t depth; /* container nesting height: scalar 0, [] 1, [[]] 2 */
    uint8_t frozen; /* placed inside another container: no more mutation */
    uint8_t opaque; /* is, or contains, a reader-only kind */
} pv_box;

#define PV_BOX(v) ((pv_box *)(v))

pv *pv_new_kind(int kind);
/* Take ownership of a malloc'd buffer as a PV_STR/PV_BYTES (buf must have
 * room for len+1 bytes; the NUL is written here). */
pv *pv_str_take(int kind, char *buf, size_t len);
/* Raw append to a list/tuple (steals item), no checks. */
int pv_seq_push(pv *seq, pv *item);
/* Raw append of a key/value pair (steals both), no duplicate check. */
int pv_dict_push(pv *dict, pv *key, pv *val);
/* Remove duplicate keys as Python would: first position, last value. */
int pv_dict_dedupe(pv *dict);
/* Order of dict keys (str or int only); 0 when equal. */
int pv_key_cmp(const pv *a, const pv *b);

double pk_half_to_double(uint16_t h);

/* numpy handling (pickle_numpy.c). `fail` reports an error in the reader's
 * context (offset, opcode); ctx is the reader. */
typedef int (*pk_fail_fn)(void *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef struct {
    void *ctx;
    pk_fail_fn fail;
    size_t *derived;    /* bytes allocated for array data so far */
    size_t derived_cap; /* ... and the most allowed */
} pk_env;

int pk_dtype_from_args(const pk_env *e, const pv *args, pv *dt);
int pk_dtype_setstate(const pk_env *e, pv *dt, const pv *state);
int pk_array_setstate(const pk_env *e, pv *arr, const pv *state);
int pk_frombuffer(const pk_env *e, const pv *args, pv **out);
int pk_scalar(const pk_env *e, const pv *args, pv **out);
int pk_codecs_encode(const pk_env *e, const pv *args, pv **out);

#endif

/* safetensors files (docs/formats.md "safetensors"): a small reader and
 * writer of our own.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 * {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *  ..., "__metadata__": {"KEY": "VALUE", ...}}, then the data buffer;
 * offsets are relative to the buffer's start.
 *
 * The reader maps the file and checks it as hostile input before anything
 * is used: the header length (at most ST_MAX_HEADER bytes, within the
 * file), the JSON (parsed by text/pyjson.h; repeated keys refused), every
 * entry's fields, the dtype, the shape (non-negative, element and byte
 * counts without overflow), data_offsets (inside the buffer, end - begin
 * == bytes of the shape and dtype, tensors tiling the buffer exactly: no
 * overlap, no gap, nothing after the last one, as the reference
 * implementation requires) and the metadata (string values only). Errors
 * are ND_EFORMAT (ND_EUNSUPPORTED for a dtype we do not read) with a
 * message naming the file and the tensor or field.
 *
 * The writer is atomic (temp file, fsync, rename: the path holds the old
 * file or the whole new one), pads the header with spaces so the data
 * starts on an 8-byte boundary and writes tensors in the order given. */
#ifndef ND_SAFETENSORS_H
#define ND_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "io/pickle.h"

#define ST_MAX_HEADER ((uint64_t)100000000) /* bytes, as the reference reader */
#define ST_MAX_NDIM PV_MAX_NDIM

typedef enum {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_NDTYPES
} st_dtype;

typedef struct {
    char *name; /* UTF-8, NUL-terminated, no NUL inside */
    st_dtype dtype;
    int ndim; /* 0: a scalar */
    int64_t shape[ST_MAX_NDIM];
    uint64_t numel, nbytes;
    uint64_t begin, end; /* data_offsets */
    const void *data;    /* inside the mapping; not aligned in general */
} st_tensor;

typedef struct {
    char *key, *val; /* NUL-terminated; val_len may include NULs */
    size_t val_len;
} st_meta;

typedef struct {
    void *map; /* the mapping (NULL for st_parse) */
    size_t map_len;
    const unsigned char *buf; /* file bytes */
    size_t len;
    uint64_t header_len;
    st_tensor *t; /* in header order */
    size_t n;
    st_meta *meta;
    size_t n_meta;
} st_file;

/* "F32" etc.; element size in bytes (ST_BOOL/U8/I8/F8: 1). */
const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);

/* Whether the first bytes look like a safetensors file: a header length
 * of at least 2 and at most ST_MAX_HEADER, then '{'. */
int st_sniff(const unsigned char *p, size_t n);

/* Map and validate `path`. */
int st_open(const char *path, st_file *f);
/* Validate bytes held in memory (not copied: they must outlive f); `what`
 * names them in messages. */
int st_parse(const void *buf, size_t len, const char *what, st_file *f);
void st_close(st_file *f);

const st_tensor *st_find(const st_file *f, const char *name);
/* Metadata value by key, or NULL. */
const st_meta *st_meta_get(const st_file *f, const char *key);

/* A tensor converted to float32 (F32/F16/BF16/F64 only), n = numel
 * floats written to dst. */
int st_to_f32(const st_tensor *t, float *dst);

/* ---- writing ---- */
typedef struct {
    const char *name;
    st_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data; /* numel * dtype size bytes, little-endian */
} st_out_tensor;

typedef struct {
    const char *key, *val;
} st_out_meta;

int st_write_file(const char *path, const st_out_tensor *t, size_t n, const st_out_meta *meta,
                  size_t n_meta);
/* The same bytes into a malloc'd buffer. */
int st_write_mem(const st_out_tensor *t, size_t n, const st_out_meta *meta, size_t n_meta,
                 unsigned char **out, size_t *out_len);

/* ---- needle trees (the same in-memory tree the pickle path builds) ---- */

/* The tree of a safetensors checkpoint or adapter:
 *   checkpoint: {"format_version": int|None, "params": nested dicts of
 *                arrays split on '/', "config": dict from the JSON,
 *                "step": int|None, "run": value from the JSON}
 *   adapter (metadata has "scale" and no "format_version"):
 *               {"lora": {PATH: {"A", "B"}}, "scale", "base", "rank",
 *                "seed"} (metadata values as JSON)
 * plus our extra top-level keys (needle_c_state, ...): a metadata entry
 * KEY holding the JSON of the value, and its arrays as tensors KEY/SUBPATH.
 * BF16 tensors become float32 arrays; F16, F64, I32, I64 and BOOL keep
 * their type (float16 as a pickle's float16 arrays). */
int st_tree_from_file(const st_file *f, const char *what, pv **out);
int st_tree_load(const char *path, pv **out);

/* Write such a tree (arrays keep their dtype: float32 or float16 as
 * asked by ckpt_tree_params_to_dtype). */
int st_tree_save(const pv *root, const char *path);
/* The same file's bytes into a malloc'd buffer. */
int st_tree_dumps(const pv *root, unsigned char **out, size_t *out_len);

/* Python's json.dumps (default separators, ensure_ascii) of a pv holding
 * None/bool/int/float/str/list/tuple/dict with str keys; malloc'd. */
int st_pv_to_json(const pv *v, char **out);
/* json.loads into a pv (objects -> dicts, arrays -> lists). */
int st_json_to_pv(const char *text, size_t len, const char *what, pv **out);

#endif

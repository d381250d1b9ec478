/* LoRA adapters on the five attention projections (docs/model.md §4.2;
 * the adapter file: docs/formats.md §2).
 *
 * A (L, in, r) and B (L, r, out) per target live in one buffer whose layout
 * is shared by gradients and optimiser moments. The effective weight is
 * W + scale * A @ B; training merges it once per step into a copy of the
 * projection weights so the forward pass is unchanged. */
#ifndef ND_LORA_H
#define ND_LORA_H

#include <stdint.h>

#include "io/pickle.h"
#include "model/params.h"

/* Largest |scale| an adapter may carry (upstream's is alpha/rank, ~2). */
#define LORA_MAX_SCALE 1e6

enum { LORA_Q, LORA_K, LORA_V, LORA_GATE, LORA_OUT, LORA_NTARGETS };

typedef struct {
    int present;         /* target adapted (its base kernel is not all zero) */
    int in, out;         /* per-layer kernel shape */
    size_t a_off, b_off; /* floats from the buffer start */
} san_lora_target;

typedef struct {
    int rank, L;
    float alpha, scale; /* scale = alpha / rank */
    san_lora_target t[LORA_NTARGETS];
    size_t numel;
    float *mem;                      /* where host code reads and writes the adapter */
    const struct nd_backend *mem_be; /* mem (or dev) from this backend's alloc (NULL: host) */
    /* what the ops read: mem itself, or (a backend without host_mem) a
     * device copy that san_lora_upload refreshes; see san_model.dev */
    float *dev;
    char base[512]; /* checkpoint path recorded in the adapter file */
} san_lora;

/* Flax path of a target's base kernel. */
const char *san_lora_target_name(int target);
/* Layout for a model: targets whose base max|w| > 1e-6 (docs/formats.md §2.2). */
int san_lora_create(san_lora *lo, const san_model *m, int rank, float alpha);
void san_lora_free(san_lora *lo);
/* Put the adapter in a device backend's memory (no-op for the CPU); see
 * san_model_to_backend. */
int san_lora_to_backend(san_lora *lo, const struct nd_backend *be);
/* After host code changed lo->mem: the device copy follows (issue order). */
void san_lora_upload(san_lora *lo);
/* The adapter as the ops read it (lo->dev, or lo->mem) */
static inline float *san_lora_dev(const san_lora *lo)
{
    return lo->dev ? lo->dev : lo->mem;
}
/* A ~ N(0,1)/rank, B = 0 (deterministic for a seed). */
void san_lora_init(san_lora *lo, uint64_t seed);
/* Pointers to target t's A / B inside an arbitrary buffer of lo->numel. */
static inline float *san_lora_A(const san_lora *lo, float *buf, int t)
{
    return buf + lo->t[t].a_off;
}
static inline float *san_lora_B(const san_lora *lo, float *buf, int t)
{
    return buf + lo->t[t].b_off;
}
/* Pointer to target t's stacked base kernel inside a san_weights. */
float *san_lora_weight_slot(san_weights *w, int t);

/* Adapter pickle (docs/formats.md §2.1): {"lora": {path: {"A", "B"}}, "scale", "base", "rank"}.
 * Saving writes atomically; extra optimiser state may ride along. */
pv *san_lora_to_pv(const san_lora *lo);
int san_lora_save(const san_lora *lo, const char *path, pv *extra /* stolen, may be NULL */);
/* Load an adapter for `m` (ours or upstream's): shapes checked against the
 * model, naming the tensor on mismatch. */
int san_lora_load(san_lora *lo, const san_model *m, const char *path, pv **root_out);
/* Same from a parsed adapter tree (only read); `path` names it in messages. */
int san_lora_from_tree(san_lora *lo, const san_model *m, const pv *root, const char *path);

#endif

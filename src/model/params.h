/* The SAN parameters: one float32 allocation, a table of named tensors
 * (flax paths, shapes as in the checkpoint), and typed pointers into it.
 * The same layout serves weights, gradients and optimiser moments. */
#ifndef ND_PARAMS_H
#define ND_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

/* Pointers into one flat buffer. Per-layer tensors are stacked along a
 * leading L axis, exactly as in the checkpoint. */
typedef struct {
    float *emb;                          /* (V, d) */
    float *norm_in;                      /* (L, d) */
    float *wq, *wk, *wv, *wgate, *wout;  /* (L, in, out) */
    float *q_norm, *k_norm;              /* (L, hd) */
    float *post_norm, *pre_hada;         /* (L, d) */
    float *attn_gate;                    /* (L) */
    float *d1, *d2, *d3;                 /* (L, hada_n) */
    float *phi_pre, *phi_post, *phi_res; /* (L, n*d, n|n|n*n) */
    float *b_pre, *b_post, *b_res;       /* (L, n), (L, n), (L, n, n) */
    float *a_pre, *a_post, *a_res;       /* (L) */
    float *final_norm;                   /* (d) */
    /* Needle 3 only (NULL for generation 2) */
    float *q_taps, *k_taps, *v_taps;          /* (L, taps, q_dim | k_dim | v_dim) */
    float *w1a, *w1b, *w2a, *w2b, *w3a, *w3b; /* Kronecker factors (hadamard_mlp) */
    float *b2, *d4;                           /* (L, hada_n) */
    float *cond_v, *cond_u;                   /* (L, d, 8), (L, 8, hada_n) */
    float *bank[SAN_MAX_SITES];               /* engram_banks_<b>/embedding */
    struct {
        float *table; /* (K, slots, sub); with engram banks: its bank's table */
        float *wk;    /* (K*sub, d) */
        float *wv;    /* (K*sub, d) */
        float *taps;  /* (4, d) */
    } eng[SAN_MAX_SITES];
} san_weights;

typedef enum {
    INIT_ZEROS,
    INIT_ONES,
    INIT_CONST,   /* value */
    INIT_NORMAL,  /* N(0, value^2) */
    INIT_RES_EYE, /* 4 * I per leading index (mhc_b_res) */
    INIT_TAPS,    /* row 0 ones, other rows zero (identity conv) */
    INIT_WALSH,   /* the last two axes: the orthonormal Walsh matrix, per leading index */
} san_init_kind;

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[4];
    size_t numel;
    size_t offset; /* floats from the start of the buffer */
    size_t slot;   /* byte offset of the pointer inside san_weights */
    san_init_kind init;
    float init_value;
} san_tensor;

typedef struct {
    san_config cfg;
    san_dims dims;
    int n_tensors;
    san_tensor *tensors;
    size_t numel;                    /* total floats */
    float *mem;                      /* the weights, where host code reads and writes them */
    san_weights w;                   /* the weights the ops read: bound to dev */
    const struct nd_backend *mem_be; /* mem (or dev) came from this backend's alloc (NULL: host) */
    /* what the ops read: mem itself (host memory, or a backend's memory the
     * host can reach), or a copy in device memory (a backend without
     * host_mem: CUDA) that san_model_upload refreshes from mem */
    float *dev;
} san_model;

/* Build the tensor table for a config (no weights allocated). */
int san_model_layout(san_model *m, const san_config *cfg);
/* Layout + allocate zeroed weights. */
int san_model_create(san_model *m, const san_config *cfg);
void san_model_free(san_model *m);
/* Put the weights in `be`'s memory when it is a device backend (a no-op
 * for the CPU), so ops read them in place: moved there when the host can
 * reach that memory (be->host_mem; it reads and writes them after
 * nd_backend_sync()), else copied to m->dev, m->mem staying the host's. */
int san_model_to_backend(san_model *m, const struct nd_backend *be);
/* After host code changed m->mem: the device copy (m->dev) follows, in
 * issue order (nothing to do where dev is mem). */
void san_model_upload(san_model *m);
/* The weights as the ops read them (m->dev, or m->mem) */
static inline float *san_model_dev(const san_model *m)
{
    return m->dev ? m->dev : m->mem;
}
/* A weight the host reads by value (a per-layer gain handed to an op as a
 * float): p points into the ops' copy; the host's copy at the same offset
 * (m->mem) when that is device memory (CUDA), else *p itself (the CPU,
 * where they are one buffer: the same read as before). */
static inline float san_weight_host(const san_model *m, const float *p)
{
    uintptr_t d = (uintptr_t)m->dev, a = (uintptr_t)p;
    if (m->dev && m->dev != m->mem && a >= d && a < d + m->numel * sizeof(float))
        return m->mem[(a - d) / sizeof(float)];
    return *p;
}
/* Point a san_weights at `mem` (a buffer of m->numel floats). With engram
 * banks (3.x), eng[s].table points at bank engram_bank_ids[s]. */
void san_weights_bind(const san_model *m, float *mem, san_weights *w);
/* ND_ENUMERIC naming the first tensor (and element) that is NaN or Inf;
 * `what` (e.g. the file) starts the message. */
int san_model_check_finite(const san_model *m, const char *what);
/* Find a tensor by flax path, or NULL. */
const san_tensor *san_model_find(const san_model *m, const char *name);
/* Upstream's initialisers, deterministic for a seed. */
void san_model_init_random(san_model *m, uint64_t seed);
/* Initialise one tensor's data per its init kind (shared with the
 * initialiser of extra tensors such as mtp_*). */
void san_tensor_init(const san_tensor *t, float *data, void *rng);
/* Tensors a fresh checkpoint has beside the model's own (upstream's
 * model.init): 3.x's probe heads (embedding_head, confidence_head,
 * router_head), which fine-tuning reads and preserves but does not use.
 * Fills up to cap entries (name, shape, init; offsets unused); returns the
 * count, 0 for generation 2 (its mtp_* extras live in the checkpoint code). */
int san_model_extra_tensors(const san_model *m, san_tensor *out, int cap);

#endif

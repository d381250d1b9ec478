/* Needle 3's Kronecker-factored Hadamard MLP (upstream architecture.py,
 * HadamardMLP), forward and backward in float32, on any backend.
 *
 * For a row x of d features, n = the next power of two >= d,
 * (ba, bb) = (1 << (bit_length(n-1) / 2), n / ba), feature m = i*bb + j:
 *
 *   cond = 1 + softmax(x @ cond_v) @ cond_u            (rank 8)
 *   z    = pad(x, n)
 *   z    = F1(d1 * z)[p1]
 *   z    = F2(silu(d2 * cond * z + b2))[p2]
 *   z    = F3(d3 * z)
 *   y    = (d4 * z)[:d]
 *
 * where v[p] gathers (v[p][m] = v[p[m]]) and F applies a factor pair (wa, wb):
 *   shared (untied 0): wa (ba, ba), wb (bb, bb):
 *       F(z)[k*bb + l] = sum_ij z[i*bb + j] wa[i,k] wb[j,l]
 *   block_untied (1):  wa (bb, ba, ba), wb (ba, bb, bb):
 *       F(z)[k*bb + l] = sum_ij z[i*bb + j] wa[j,i,k] wb[k,j,l]
 * p1, p2 = numpy RandomState(11 / 13).permutation(n); split: the first half
 * permuted by RandomState(s).permutation(n/2), the second half by
 * n/2 + RandomState(s + 977).permutation(n/2).
 *
 * The Kronecker products run as the backend's matmuls over all rows at once
 * (the rows are kept in blocked layouts, see hada3.c); the element-wise
 * stages are the backend ops hada3_mix / hada3_mix_backward and
 * softmax_rows(_backward). Every pointer given to forward / backward
 * (weights, x, y, saved, dy, dx, gradients) must be in memory of `be`
 * (be->alloc) or, for a host backend, plain memory; the functions sync the
 * backend before they return. */
#ifndef ND_HADA3_H
#define ND_HADA3_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* HADA_COND_RANK of upstream */
#define SAN_HADA3_COND_RANK 8

typedef struct san_hada3_ws san_hada3_ws; /* scratch kept between calls (hada3.c) */

typedef struct {
    int d, n, ba, bb, untied;
    int32_t *perm1, *perm2;
    san_hada3_ws *ws; /* NULL: forward and backward allocate their scratch per call */
} san_hada3_geom;

/* d >= 1; untied: 1 for factor_mode "block_untied", 0 for "shared"; split:
 * hada_split (split permutations). ND_OK, ND_EARG or ND_ENOMEM. */
int san_hada3_geom_init(san_hada3_geom *g, int d, int untied, int split);
/* Frees the permutations and the kept scratch. */
void san_hada3_geom_free(san_hada3_geom *g);

/* Keep the scratch of forward and backward (a few N x n blocks: 4 N n +
 * 8 N floats at most) in be's memory from call to call, grown when a call
 * has more rows, instead of allocating (and zeroing) it in every call: for
 * callers that run many calls in a row (training: two per layer and step).
 * Calls with this geometry must then use be and not run concurrently.
 * ND_OK or ND_ENOMEM. */
int san_hada3_keep_scratch(san_hada3_geom *g, const nd_backend *be);
/* Floats of the kept scratch now (0: none kept, or nothing run yet). */
size_t san_hada3_scratch_floats(const san_hada3_geom *g);

typedef struct {
    const float *w1a, *w1b, *w2a, *w2b, *w3a, *w3b, *d1, *d2, *b2, *d3, *d4, *cond_v, *cond_u;
} san_hada3_w; /* one layer's slices, shapes as in TEAM.md without the L axis */

typedef struct {
    float *w1a, *w1b, *w2a, *w2b, *w3a, *w3b, *d1, *d2, *b2, *d3, *d4, *cond_v, *cond_u;
} san_hada3_grad; /* accumulated (+=); the struct pointer may be NULL (frozen weights: only dx) */

/* Floats the forward keeps per row for the backward (8 + 2n: the softmax
 * of the cond logits and the outputs of F1 and F2). The N rows' floats are
 * laid out together (blocks of N rows, not row after row), so a backward
 * must get the same x, N and saved as the forward that filled it. */
size_t san_hada3_saved_per_row(const san_hada3_geom *g);

/* y [N, d] from x [N, d]; saved: N * saved_per_row floats, or NULL. y must
 * not overlap x. */
int san_hada3_forward(const nd_backend *be, const san_hada3_geom *g, const san_hada3_w *w,
                      const float *x, long N, float *y,
                      float *saved /* N*saved_per_row floats, or NULL */);

/* dx [N, d] (written) and gw (+=, may be NULL) from dy [N, d]; saved: what
 * the forward of the same x kept, or NULL (then it is recomputed). dx must
 * not overlap x or dy. */
int san_hada3_backward(const nd_backend *be, const san_hada3_geom *g, const san_hada3_w *w,
                       const float *x, long N, const float *saved, const float *dy,
                       float *dx /* written */, san_hada3_grad *gw);

#endif

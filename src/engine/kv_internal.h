/* The KV cache's storage as the engine's forward (forward.c) and the
 * cached attention (attention.c) use it: kv.c owns the rows (allocation,
 * growth, sliding, snapshots, the int8 formats); everything else only
 * reads and appends through these. Internal to src/engine. */
#ifndef ND_ENGINE_KV_INTERNAL_H
#define ND_ENGINE_KV_INTERNAL_H

#include "core/threadpool.h"
#include "engine/engine.h"

/* the longest n-gram order of the model's engram (at least 1) */
int nd_kv_max_order(const san_model *m);
/* most tokens one chunk of a forward may add */
int nd_kv_chunk_step(const nd_kv_state *s);
/* with the window on: drop old rows so that n new ones fit */
int nd_kv_make_room(nd_kv_state *s, int n);
/* RoPE cos/sin of the n positions from absolute position ap0 into
 * s->rope_far_cos / rope_far_sin ([n][hd/2]) */
void nd_kv_rope_rows(nd_kv_state *s, long ap0, int n);
/* grow the storage to hold `need` positions */
int nd_kv_reserve(nd_kv_state *s, int need);
/* append layer l's K (after RoPE) and V rows of positions p0..p0+n-1
 * (k, v: [n, kv_dim]) in the cache's format */
void nd_kv_store_rows(nd_kv_state *s, int l, int p0, int n, const float *k, const float *v);
/* int8 cache: v' rows p0..p0+n-1 of a site from s->eng_vp */
void nd_kv_store_vp_rows(nd_kv_state *s, int site, int p0, int n);
/* int8 cache: v' row r of a site as floats, in the first row of s->eng_vp
 * (free once the new rows are stored) */
const float *nd_kv_vp_row(nd_kv_state *s, int site, int r);

/* A decode step runs its small operations on this thread only (a fork
 * costs more than they do) but may share the big ones, the projections and
 * the attention, with the other threads: lift the step's serial mode for
 * one of those; returns what nd_set_serial must restore. */
static inline int nd_kv_big_parallel_begin(const nd_kv_state *s)
{
    return s->big_parallel ? nd_set_serial(0) : nd_serial();
}

#endif

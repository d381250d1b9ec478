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
/* how many of `want` new tokens the next forward_chunk takes: a chunk's
 * worth, or once a sliding cache is full what one slide makes room for */
int nd_kv_next_rows(const nd_kv_state *s, int want);
/* with the window on: drop old rows so that n new ones fit */
int nd_kv_make_room(nd_kv_state *s, int n);
/* RoPE cos/sin of the n positions from absolute position ap0 into
 * s->rope_far_cos / rope_far_sin ([n][hd/2]) */
void nd_kv_rope_rows(nd_kv_state *s, long ap0, int n);
/* grow the storage to hold `need` positions */
int nd_kv_reserve(nd_kv_state *s, int need);
int nd_kv_map_rows(nd_kv_state *s, int n);
void nd_kv_map_scratch(nd_kv_state *s);
/* append layer l's K (after RoPE) and V rows of positions p0..p0+n-1
 * (k, v: [n, kv_dim]) in the cache's format */
void nd_kv_store_rows(nd_kv_state *s, int l, int p0, int n, const float *k, const float *v);
/* int8 cache: v' rows p0..p0+n-1 of a site from s->eng_vp */
void nd_kv_store_vp_rows(nd_kv_state *s, int site, int p0, int n);
/* int8 cache: v' row r of a site as floats, in the first row of s->eng_vp
 * (free once the new rows are stored) */
const float *nd_kv_vp_row(nd_kv_state *s, int site, int r);

/* ---- Needle 3's bounded history ----
 * Positions back from len that a rewind finds in the rings (the conv
 * rows', the local layers'); a longer rewind runs the rows again from the
 * pinned prefix's end (nd_kv_prepare). */
#define ND_KV_TAIL 64

/* the key of row r: its absolute position (drops do not change it) */
static inline long nd_kv_key(const nd_kv_state *s, int r)
{
    return (long)r + s->evicted;
}

/* the row of cache slot `slot` that holds row r (a local layer's ring) */
static inline int nd_kv_slot_row(const nd_kv_state *s, int slot, int r)
{
    if (!s->lr_ring || !s->kv_local[slot] || r < s->lr_base)
        return r;
    return s->lr_base + (int)((nd_kv_key(s, r) - s->lr_base) % s->lr_ring);
}

/* layer l's pre-conv q|k|v row of key k in the conv ring */
static inline float *nd_kv_cv_row(const nd_kv_state *s, int l, long k)
{
    const san_dims *D = &s->m->dims;
    size_t cw = (size_t)D->q_dim + D->k_dim + D->v_dim;
    return s->cv + ((size_t)l * s->cv_ring + (size_t)(k % s->cv_ring)) * cw;
}

/* Before a forward: when a rewind went past what the rings hold, run the
 * rows again from the latest point whose state is kept (the pinned
 * prefix's end, or row 0); non-zero when that fails. */
int nd_kv_prepare(nd_kv_state *s);
/* After a forward of rows p0..p0+n-1: what the rings now hold, and the
 * conv rows at the pinned prefix's end once a forward passes it. */
void nd_kv_note_rows(nd_kv_state *s, int p0, int n);
/* Before the rows p0..p0+n-1 land: what the rings will no longer hold. */
void nd_kv_note_write(nd_kv_state *s, int p0, int n);
/* After a forward call of n tokens: without the sliding window (the
 * session's prefix, before it pins it), the conv rows at len are kept as
 * the pinned prefix's end (what a prefix cache copies, read by other
 * threads: written before the rows are lent, never while they are). */
void nd_kv_note_call(nd_kv_state *s, int n);
/* Tests: keep the whole conv history and local layers' rows (the engine
 * before they were bounded), as a reference. Call before the first forward. */
int nd_kv_set_unbounded(nd_kv_state *s);

/* A decode step runs its small operations on this thread only (a fork
 * costs more than they do) but may share the big ones, the projections and
 * the attention, with the other threads: lift the step's serial mode for
 * one of those; returns what nd_set_serial must restore. */
static inline int nd_kv_big_parallel_begin(const nd_kv_state *s)
{
    return s->big_parallel ? nd_set_serial(0) : nd_serial();
}

#endif

/* Prefix KV cache: the rows of a system + tools prefix, kept per model and
 * keyed by SHA-256 of the prefix's token ids, so a session (or a retrieved
 * tool set) that starts with a prefix seen before restores its KV rows
 * instead of running it again. A small LRU shared by every session of the
 * model; all calls are thread-safe.
 *
 * The session that ran a prefix lends its rows (nd_prefix_cache_lend): the
 * entry points at that session's cache and no copy exists while it is the
 * only user. The copy is made when a second session asks for the prefix,
 * or when the lender is about to change or free those rows
 * (nd_prefix_cache_release), so one session never holds its tools twice. */
#ifndef ND_PREFIX_CACHE_H
#define ND_PREFIX_CACHE_H

#include <pthread.h>
#include <stdint.h>

#include "engine/engine.h"

#define ND_PREFIX_CACHE_MAX 16 /* most entries a limit can ask for */

typedef struct {
    unsigned char key[32];
    unsigned long stamp; /* last use; 0 = empty slot */
    int len;             /* rows of the prefix */
    /* the rows: lent by a live session's cache (rows 0..len-1 of owner,
     * which stay as they are until it releases them), or a copy in snap */
    const nd_kv_state *owner;
    nd_kv_snap snap;
} nd_prefix_entry;

typedef struct nd_prefix_cache {
    pthread_mutex_t mu;
    int limit;
    unsigned long clock;
    long hits, misses;
    nd_prefix_entry e[ND_PREFIX_CACHE_MAX];
} nd_prefix_cache;

/* limit from $NEEDLE_PREFIX_CACHE (entries; 0 = off), default 4 */
void nd_prefix_cache_init(nd_prefix_cache *c);
void nd_prefix_cache_free(nd_prefix_cache *c);
/* Restore the cached rows of ids[0..n) into s: 1 on a hit, 0 on a miss. */
int nd_prefix_cache_lookup(nd_prefix_cache *c, const int32_t *ids, int n, nd_kv_state *s);
/* Keep s's first n rows (which hold ids[0..n)) for later lookups; best
 * effort: out of memory just leaves the cache as it was. */
void nd_prefix_cache_store(nd_prefix_cache *c, const int32_t *ids, int n, const nd_kv_state *s);
/* Lend s's first n rows (which hold ids[0..n)) for later lookups without
 * copying them: s must call nd_prefix_cache_release before it changes any
 * of those rows, frees them or grows its storage. */
void nd_prefix_cache_lend(nd_prefix_cache *c, const int32_t *ids, int n, const nd_kv_state *s);
/* s is about to change rows from `keep` on (0: to be freed): the entries
 * it lent past that row get their own copy (dropped when out of memory). */
void nd_prefix_cache_release(nd_prefix_cache *c, const nd_kv_state *s, int keep);

/* The model's cache (session.c owns the model struct). */
nd_prefix_cache *nd_model_prefix_cache(struct needle_model *M);

#endif

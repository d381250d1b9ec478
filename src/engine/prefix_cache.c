/* Prefix KV cache (see prefix_cache.h). */
#include "engine/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "core/tuning.h"

void nd_prefix_cache_init(nd_prefix_cache *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->limit = 4;
    const char *env = nd_tuning_get()->prefix_cache;
    if (env && *env) {
        long v = strtol(env, NULL, 10);
        c->limit = v < 0 ? 0 : v > ND_PREFIX_CACHE_MAX ? ND_PREFIX_CACHE_MAX : (int)v;
    }
}

static void drop_entry(nd_prefix_entry *e)
{
    nd_kv_snap_free(&e->snap);
    e->owner = NULL;
    e->len = 0;
    e->stamp = 0;
}

/* a lent entry's own copy of its rows (caller holds the lock: the lender
 * waits in nd_prefix_cache_release before it changes them); 0 when done */
static int materialize(nd_prefix_entry *e)
{
    if (!e->owner)
        return 0;
    if (nd_kv_snapshot_rows(e->owner, e->len, &e->snap))
        return -1;
    e->owner = NULL;
    return 0;
}

void nd_prefix_cache_free(nd_prefix_cache *c)
{
    for (int i = 0; i < ND_PREFIX_CACHE_MAX; i++)
        drop_entry(&c->e[i]);
    pthread_mutex_destroy(&c->mu);
}

/* the key covers the token ids only: the model (weights, KV format) is the
 * cache's owner */
static void prefix_key(const int32_t *ids, int n, unsigned char key[32])
{
    nd_sha256(ids, (size_t)n * sizeof *ids, key);
}

/* slot holding key, or -1; caller holds the lock */
static int find(const nd_prefix_cache *c, const unsigned char key[32], int n)
{
    for (int i = 0; i < c->limit; i++)
        if (c->e[i].stamp && c->e[i].len == n && !memcmp(c->e[i].key, key, 32))
            return i;
    return -1;
}

int nd_prefix_cache_lookup(nd_prefix_cache *c, const int32_t *ids, int n, nd_kv_state *s)
{
    unsigned char key[32];
    prefix_key(ids, n, key);
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    int i = c->limit ? find(c, key, n) : -1;
    /* a second session wants a lent prefix: now the cache needs its copy */
    if (i >= 0 && c->e[i].owner == s)
        i = -1;
    if (i >= 0 && materialize(&c->e[i])) {
        drop_entry(&c->e[i]);
        i = -1;
    }
    if (i >= 0 && c->e[i].snap.kv_int8 == s->kv_int8 && nd_kv_restore(s, &c->e[i].snap) == 0) {
        c->e[i].stamp = ++c->clock;
        hit = 1;
    }
    if (c->limit) {
        c->hits += hit;
        c->misses += !hit;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

/* an empty slot, else the least recently used; caller holds the lock */
static int lru_slot(const nd_prefix_cache *c)
{
    int slot = 0;
    for (int i = 0; i < c->limit; i++) {
        if (!c->e[i].stamp)
            return i;
        if (c->e[i].stamp < c->e[slot].stamp)
            slot = i;
    }
    return slot;
}

void nd_prefix_cache_store(nd_prefix_cache *c, const int32_t *ids, int n, const nd_kv_state *s)
{
    unsigned char key[32];
    prefix_key(ids, n, key);
    pthread_mutex_lock(&c->mu);
    int skip = !c->limit || find(c, key, n) >= 0;
    pthread_mutex_unlock(&c->mu);
    nd_kv_snap snap;
    /* the copy is made outside the lock: other sessions keep going */
    if (skip || nd_kv_snapshot(s, n, &snap))
        return;
    pthread_mutex_lock(&c->mu);
    if (!c->limit || find(c, key, n) >= 0) { /* turned off, or another session was first */
        pthread_mutex_unlock(&c->mu);
        nd_kv_snap_free(&snap);
        return;
    }
    int slot = lru_slot(c);
    drop_entry(&c->e[slot]);
    memcpy(c->e[slot].key, key, 32);
    c->e[slot].len = n;
    c->e[slot].snap = snap;
    c->e[slot].stamp = ++c->clock;
    pthread_mutex_unlock(&c->mu);
}

void nd_prefix_cache_lend(nd_prefix_cache *c, const int32_t *ids, int n, const nd_kv_state *s)
{
    unsigned char key[32];
    prefix_key(ids, n, key);
    pthread_mutex_lock(&c->mu);
    if (c->limit && find(c, key, n) < 0 && n <= s->len) {
        int slot = lru_slot(c);
        drop_entry(&c->e[slot]);
        memcpy(c->e[slot].key, key, 32);
        c->e[slot].len = n;
        c->e[slot].owner = s;
        c->e[slot].stamp = ++c->clock;
    }
    pthread_mutex_unlock(&c->mu);
}

void nd_prefix_cache_release(nd_prefix_cache *c, const nd_kv_state *s, int keep)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < ND_PREFIX_CACHE_MAX; i++)
        if (c->e[i].stamp && c->e[i].owner == s && c->e[i].len > keep && materialize(&c->e[i]))
            drop_entry(&c->e[i]);
    pthread_mutex_unlock(&c->mu);
}

void nd_prefix_cache_limit(struct needle_model *M, int entries)
{
    nd_prefix_cache *c = nd_model_prefix_cache(M);
    entries = entries < 0 ? 0 : entries > ND_PREFIX_CACHE_MAX ? ND_PREFIX_CACHE_MAX : entries;
    pthread_mutex_lock(&c->mu);
    for (int i = entries; i < ND_PREFIX_CACHE_MAX; i++)
        drop_entry(&c->e[i]);
    c->limit = entries;
    pthread_mutex_unlock(&c->mu);
}

nd_prefix_cache_stats nd_prefix_cache_get_stats(struct needle_model *M)
{
    nd_prefix_cache *c = nd_model_prefix_cache(M);
    nd_prefix_cache_stats st = {0};
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->limit; i++)
        if (c->e[i].stamp) {
            st.entries++;
            st.bytes += c->e[i].snap.bytes;
        }
    st.hits = c->hits;
    st.misses = c->misses;
    pthread_mutex_unlock(&c->mu);
    return st;
}

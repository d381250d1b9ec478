#include "train/pack.h"

#include <stdlib.h>
#include <string.h>

int nd_pack_plan_init(nd_pack_plan *p, int cap)
{
    memset(p, 0, sizeof *p);
    size_t c = (size_t)(cap > 0 ? cap : 1);
    p->order = malloc(sizeof *p->order * c);
    p->gstart = malloc(sizeof *p->gstart * (c + 1));
    p->gplen = malloc(sizeof *p->gplen * c);
    p->lcp = malloc(sizeof *p->lcp * c);
    p->best = malloc(sizeof *p->best * (c + 1));
    p->from = malloc(sizeof *p->from * (c + 1));
    if (!p->order || !p->gstart || !p->gplen || !p->lcp || !p->best || !p->from) {
        nd_pack_plan_free(p);
        return -1;
    }
    p->cap = cap;
    return 0;
}

void nd_pack_plan_free(nd_pack_plan *p)
{
    free(p->order);
    free(p->gstart);
    free(p->gplen);
    free(p->lcp);
    free(p->best);
    free(p->from);
    memset(p, 0, sizeof *p);
}

static int common_prefix(const nd_seq_example *a, const nd_seq_example *b)
{
    int n = a->len < b->len ? a->len : b->len, i = 0;
    while (i < n && a->ids[i] == b->ids[i])
        i++;
    return i;
}

/* lexicographic by tokens, then by index (a total order: the plan is the
 * same whatever the sort) */
static int before(const nd_seq_example *ex, int a, int b)
{
    int c = common_prefix(&ex[a], &ex[b]);
    if (c < ex[a].len && c < ex[b].len)
        return ex[a].ids[c] != ex[b].ids[c] ? ex[a].ids[c] < ex[b].ids[c] : a < b;
    if (ex[a].len != ex[b].len)
        return ex[a].len < ex[b].len;
    return a < b;
}

int nd_pack_plan_make(nd_pack_plan *p, const nd_seq_example *ex, int count, int share)
{
    if (count > p->cap || count < 0)
        return -1;
    p->count = count;
    p->real = 0;
    for (int i = 0; i < count; i++) {
        p->order[i] = i;
        p->real += ex[i].len;
    }
    if (!share || count < 2) {
        p->n_groups = count;
        for (int i = 0; i <= count; i++)
            p->gstart[i] = i;
        for (int i = 0; i < count; i++)
            p->gplen[i] = 0;
        p->rows = p->real;
        return 0;
    }
    /* insertion sort: batches are tens of examples */
    for (int i = 1; i < count; i++) {
        int v = p->order[i], j = i;
        while (j > 0 && before(ex, v, p->order[j - 1])) {
            p->order[j] = p->order[j - 1];
            j--;
        }
        p->order[j] = v;
    }
    /* in sorted order the common prefix of a run is the least adjacent
     * one; cut the order into the runs that save the most rows (DP over
     * where the last run starts) */
    for (int i = 1; i < count; i++)
        p->lcp[i] = common_prefix(&ex[p->order[i - 1]], &ex[p->order[i]]);
    p->best[0] = 0;
    for (int j = 1; j <= count; j++) {
        /* runs order[i..j-1] */
        long bestv = -1;
        int bi = j - 1, pre = 1 << 30, shortest = 1 << 30;
        for (int i = j - 1; i >= 0; i--) {
            int len = ex[p->order[i]].len;
            shortest = len < shortest ? len : shortest;
            if (i < j - 1)
                pre = p->lcp[i + 1] < pre ? p->lcp[i + 1] : pre;
            int share_len = pre < shortest - 1 ? pre : shortest - 1;
            if (j - 1 - i == 0 || share_len < 1)
                share_len = 0;
            long v = p->best[i] + (long)share_len * (j - 1 - i);
            if (v > bestv) {
                bestv = v;
                bi = i;
            }
        }
        p->best[j] = bestv;
        p->from[j] = bi;
    }
    /* walk the cuts back, then write the groups front to back */
    int ng = 0;
    for (int j = count; j > 0; j = p->from[j])
        p->gstart[ng++] = j; /* group ends, last first */
    p->n_groups = ng;
    for (int a = 0, b = ng - 1; a < b; a++, b--) {
        int t = p->gstart[a];
        p->gstart[a] = p->gstart[b];
        p->gstart[b] = t;
    }
    /* gstart holds group ends; shift to starts */
    for (int g = ng; g > 0; g--)
        p->gstart[g] = p->gstart[g - 1];
    p->gstart[0] = 0;
    p->rows = 0;
    for (int g = 0; g < ng; g++) {
        int i0 = p->gstart[g], i1 = p->gstart[g + 1];
        int pre = 1 << 30, shortest = 1 << 30;
        for (int i = i0; i < i1; i++) {
            int len = ex[p->order[i]].len;
            shortest = len < shortest ? len : shortest;
            if (i > i0)
                pre = p->lcp[i] < pre ? p->lcp[i] : pre;
        }
        int sl = pre < shortest - 1 ? pre : shortest - 1;
        p->gplen[g] = i1 - i0 >= 2 && sl >= 1 ? sl : 0;
        for (int i = i0; i < i1; i++)
            p->rows += ex[p->order[i]].len - p->gplen[g];
        p->rows += p->gplen[g];
    }
    return 0;
}

long nd_pack_group_rows(const nd_pack_plan *p, const nd_seq_example *ex, int g0, int g1)
{
    long rows = 0;
    for (int g = g0; g < g1; g++) {
        rows += p->gplen[g];
        for (int i = p->gstart[g]; i < p->gstart[g + 1]; i++)
            rows += ex[p->order[i]].len - p->gplen[g];
    }
    return rows;
}

int nd_pack_layout(const nd_pack_plan *p, const nd_seq_example *ex, int g0, int g1,
                   nd_layout_buf *lay, int32_t *tok, int32_t *row_of)
{
    nd_layout_reset(lay);
    /* offsets of each example's row map (original order) */
    long *off = NULL;
    if (p->count > 0) {
        off = malloc(sizeof *off * (size_t)p->count);
        if (!off)
            return -1;
        long o = 0;
        for (int b = 0; b < p->count; b++) {
            off[b] = o;
            o += ex[b].len;
        }
    }
    for (int g = g0; g < g1; g++) {
        int i0 = p->gstart[g], i1 = p->gstart[g + 1], pl = p->gplen[g], parent = -1;
        if (pl) {
            parent = nd_layout_add(lay, pl, -1);
            if (parent < 0)
                goto fail;
            int32_t start = lay->seg[parent].start;
            memcpy(tok + start, ex[p->order[i0]].ids, sizeof *tok * (size_t)pl);
        }
        for (int i = i0; i < i1; i++) {
            int b = p->order[i];
            int s = nd_layout_add(lay, ex[b].len - pl, parent);
            if (s < 0)
                goto fail;
            int32_t start = lay->seg[s].start;
            memcpy(tok + start, ex[b].ids + pl, sizeof *tok * (size_t)(ex[b].len - pl));
            for (int t = 0; t < ex[b].len; t++)
                row_of[off[b] + t] = t < pl ? lay->seg[parent].start + t : start + (t - pl);
        }
    }
    free(off);
    return 0;
fail:
    free(off);
    return -1;
}

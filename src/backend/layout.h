/* Where the rows of a batch sit in their sequences.
 *
 * A batch is N rows cut into segments of consecutive rows. A segment either
 * starts a sequence or continues a parent segment: then its first row
 * follows the parent's last row, and its rows attend to all of the
 * parent's. That is how examples sharing a prompt prefix run it once:
 * the prefix is one segment, each example's remainder a child of it. A
 * padded [B, T] batch is B segments of T rows with no parents.
 *
 * Parents never have parents, and a parent comes before its children. Ops
 * that depend on positions (engram hash/gather/taps, RoPE, attention)
 * take a layout; every other op is row-local. */
#ifndef ND_LAYOUT_H
#define ND_LAYOUT_H

#include <stdint.h>

typedef struct {
    int32_t start, len; /* rows [start, start + len) */
    int32_t parent;     /* segment this one continues, or -1 */
} nd_segment;

typedef struct {
    long N; /* rows */
    int n_seg;
    const nd_segment *seg;  /* [n_seg] */
    const int32_t *row_seg; /* [N]: the segment of each row */
    const int32_t *pos;     /* [N]: position in the row's sequence */
} nd_layout;

/* The row k steps earlier in row r's sequence, or -1 before its start. */
static inline long nd_layout_back(const nd_layout *L, long r, int k)
{
    const nd_segment *s = &L->seg[L->row_seg[r]];
    long off = r - s->start;
    if (off >= k)
        return r - k;
    if (s->parent < 0)
        return -1;
    const nd_segment *p = &L->seg[s->parent];
    long j = (long)p->len - (k - off);
    return j >= 0 ? p->start + j : -1;
}

/* A layout with its own storage (capacities fixed at creation). */
typedef struct {
    nd_layout L;
    nd_segment *seg;
    int32_t *row_seg, *pos;
    long cap_rows;
    int cap_seg;
} nd_layout_buf;

int nd_layout_buf_init(nd_layout_buf *b, long cap_rows, int cap_seg);
void nd_layout_buf_free(nd_layout_buf *b);
/* Start an empty layout. */
void nd_layout_reset(nd_layout_buf *b);
/* Append a segment of len rows (parent: an earlier segment or -1);
 * returns its index, or -1 when a capacity would be exceeded. */
int nd_layout_add(nd_layout_buf *b, int len, int parent);
/* B segments of T rows (a padded batch). 0, or -1 over capacity. */
int nd_layout_dense(nd_layout_buf *b, int B, int T);
/* Largest position + 1 over all rows (0 when empty). */
int nd_layout_max_pos(const nd_layout *L);

#endif

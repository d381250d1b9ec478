#include "backend/layout.h"

#include <stdlib.h>
#include <string.h>

int nd_layout_buf_init(nd_layout_buf *b, long cap_rows, int cap_seg)
{
    memset(b, 0, sizeof *b);
    b->seg = malloc(sizeof *b->seg * (size_t)(cap_seg > 0 ? cap_seg : 1));
    b->row_seg = malloc(sizeof *b->row_seg * (size_t)(cap_rows > 0 ? cap_rows : 1));
    b->pos = malloc(sizeof *b->pos * (size_t)(cap_rows > 0 ? cap_rows : 1));
    if (!b->seg || !b->row_seg || !b->pos) {
        nd_layout_buf_free(b);
        return -1;
    }
    b->cap_rows = cap_rows;
    b->cap_seg = cap_seg;
    nd_layout_reset(b);
    return 0;
}

void nd_layout_buf_free(nd_layout_buf *b)
{
    free(b->seg);
    free(b->row_seg);
    free(b->pos);
    memset(b, 0, sizeof *b);
}

void nd_layout_reset(nd_layout_buf *b)
{
    b->L.N = 0;
    b->L.n_seg = 0;
    b->L.seg = b->seg;
    b->L.row_seg = b->row_seg;
    b->L.pos = b->pos;
}

int nd_layout_add(nd_layout_buf *b, int len, int parent)
{
    if (len < 0 || b->L.n_seg >= b->cap_seg || b->L.N + len > b->cap_rows || parent >= b->L.n_seg ||
        (parent >= 0 && b->seg[parent].parent >= 0))
        return -1;
    int s = b->L.n_seg++;
    int32_t start = (int32_t)b->L.N, p0 = parent >= 0 ? b->seg[parent].len : 0;
    b->seg[s] = (nd_segment){start, len, parent};
    for (int i = 0; i < len; i++) {
        b->row_seg[start + i] = s;
        b->pos[start + i] = p0 + i;
    }
    b->L.N += len;
    return s;
}

int nd_layout_dense(nd_layout_buf *b, int B, int T)
{
    nd_layout_reset(b);
    for (int i = 0; i < B; i++)
        if (nd_layout_add(b, T, -1) < 0)
            return -1;
    return 0;
}

int nd_layout_max_pos(const nd_layout *L)
{
    int m = 0;
    for (int s = 0; s < L->n_seg; s++) {
        const nd_segment *g = &L->seg[s];
        int end = g->len + (g->parent >= 0 ? L->seg[g->parent].len : 0);
        m = end > m ? end : m;
    }
    return m;
}

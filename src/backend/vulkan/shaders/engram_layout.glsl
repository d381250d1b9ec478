// The layout block staged by vk_layout: seg[n_seg * 3] = (start, len, parent),
// then row_seg[N], then pos[N] (int32). The helpers mirror backend/layout.h.
int lay_row_seg(I32 L, int n_seg, int r) { return L.v[3 * n_seg + r]; }
int lay_pos(I32 L, int n_seg, int N, int r) { return L.v[3 * n_seg + N + r]; }

// nd_layout_back: the row k steps earlier in row r's sequence, or -1.
int lay_back(I32 L, int n_seg, int r, int k) {
    int s = L.v[3 * n_seg + r];
    int off = r - L.v[3 * s];
    if (off >= k) return r - k;
    int p = L.v[3 * s + 2];
    if (p < 0) return -1;
    int j = L.v[3 * p + 1] - (k - off);
    return j >= 0 ? L.v[3 * p] + j : -1;
}

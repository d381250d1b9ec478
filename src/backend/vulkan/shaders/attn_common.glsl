// Shared by the attn_*.comp shaders. A workgroup of 64 invocations owns
// ROWS rows (of one segment) and one head; LANES invocations share a row,
// lane l holding columns l, l + LANES, ... (at most COLS of hd <= 128).
// Dot products are summed per lane, then over the lanes in a fixed order.
#define LANES 4
#define ROWS 16
#define COLS 32
#define HD_MAX 128
#define NEG_BIG (-3.0e38)

// layout block: seg[n_seg] as (start, len, parent), row_seg[N], pos[N]
// (macros: every shader's Args block is named a and has lay)
#define SEG_START(s) a.lay.v[3 * (s)]
#define SEG_LEN(s) a.lay.v[3 * (s) + 1]
#define SEG_PARENT(s) a.lay.v[3 * (s) + 2]

// the first key (in key order: parent rows, then own rows) a query whose
// last visible key is `last` sees under a sliding window (0: no limit)
int first_key(int last, int window) { return window > 0 ? max(last - window + 1, 0) : 0; }

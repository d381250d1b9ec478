/* Shared pieces of the backend conformance test (test_backend_ops.c):
 * a case is a set of buffers with random contents and a function that
 * issues one op (or a chain of ops) on them; the harness runs it on the
 * CPU reference and on the target backend and compares the outputs. */
#ifndef ND_BACKEND_OPS_H
#define ND_BACKEND_OPS_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/rng.h"

enum {
    BO_FIN,  /* const float input */
    BO_IIN,  /* const int32 input */
    BO_FOUT, /* float output: pre-filled with the same random values on both sides */
    BO_IOUT, /* int32 output (compared exactly) */
};

typedef struct {
    int kind;
    long n;     /* elements */
    void *data; /* the master contents */
    int host;   /* input given to the target as plain host memory (else alloc memory) */
} bo_buf;

#define BO_MAXBUF 24

typedef struct bo_case bo_case;
/* Issue the case's op(s) on be; p[i] is buffer i on that side. */
typedef void (*bo_issue)(const nd_backend *be, const bo_case *c, void *const *p);

struct bo_case {
    const char *op; /* the table row */
    double tol;     /* on the relative error */
    bo_issue issue;
    int nb;
    bo_buf b[BO_MAXBUF];
    long i[12]; /* integer parameters */
    float f[8]; /* float parameters */
    const nd_layout *L;
    const int *orders;
};

extern nd_rng bo_rng;
extern const nd_backend *bo_ref; /* the CPU reference, for inputs that come from a forward */

/* Start a case (the previous one is freed). */
bo_case *bo_new(const char *op, double tol, bo_issue issue);
/* Add buffers; each returns its index. Float contents are scale * N(0, 1);
 * a float input lies in host memory on the target about one time in four. */
int bo_fin(bo_case *c, long n, double scale);
int bo_fout(bo_case *c, long n, double scale);
int bo_iin(bo_case *c, long n, const int32_t *vals); /* always host memory */
int bo_iout(bo_case *c, long n);
float *bo_f(bo_case *c, int i);
int32_t *bo_i(bo_case *c, int i);
/* Run on both sides, compare, record in the table. */
void bo_run(bo_case *c);

/* Record a result in its op's row (the model check uses it too);
 * returns the case's number within the row. */
int bo_record(const char *op, double tol, double max_abs, double max_rel, int fail);

/* Whether the target's table has NULL for `op` (for a "chain:" or "model:"
 * row: for any op); such a row reads MISSING and fails. */
int bo_missing(const char *op);
void bo_mark_missing(const char *op);

/* Switch the process-wide CPU thread count to the reference's or the
 * target's (only matters when the target is the CPU backend itself). */
void bo_use(int target);

/* Layout from (len, parent) pairs (n pairs); a static slot per index. */
const nd_layout *bo_layout(int slot, const int *pairs, int n);

/* Shared by the case files: layouts 0..5 (see backend_ops_cases.c), random
 * ints below `below`, engram indices of random tokens (an int32 input
 * buffer; returns its index), the orders {2, 3, 4}. */
const nd_layout *bo_layouts(int k);
void bo_rand_ints(int32_t *x, long n, int below);
int bo_engram_idx(bo_case *c, const nd_layout *L, int n_orders, int heads, int slots);
extern const int bo_orders3[3];

void bo_cases_forward(void);
void bo_cases_backward(void);
void bo_cases_chains(void);
void bo_cases_hada3(void); /* backend_ops_hada3.c */
void bo_cases_v3(void); /* backend_ops_v3.c: the Needle 3 ops */
void bo_model_check(const nd_backend *tgt);

/* NEEDLE_TEST_BREAK: a copy of `real` whose ops forward to it, with op
 * `name` perturbing its first output. NULL if no op has that name. */
const nd_backend *bo_break(const nd_backend *real, const char *name);

#endif

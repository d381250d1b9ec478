/* NEEDLE_TEST_BREAK for test_backend_ops: a copy of the target's table
 * whose entries forward to the real backend (always with the real table
 * pointer), with one op broken. The test must then fail: proof that it can.
 *
 * <op>: the op perturbs its first output (its first non-const float or
 *   int32 pointer) by ~1e-3 relative after it ran.
 * defer:<op>: the op runs only at the next sync (or at the next deferred
 *   call), reading its inputs then: a legal asynchronous op as long as
 *   nothing reads its outputs before the sync and its host inputs are still
 *   there, which the test breaks on purpose (chains; host inputs
 *   overwritten after issue). Like a device backend that forgets a barrier
 *   or the copy-at-issue rule.
 *
 * One wrapper per entry of backend/ops.def, expanded from the list. */
#include <string.h>

#include "backend_ops.h"

static const nd_backend *real;
static enum nd_op broken = ND_OP_COUNT, deferred = ND_OP_COUNT;
static nd_backend wrapped;
static void (*pending)(void);

static void flush(void)
{
    void (*f)(void) = pending;
    pending = NULL;
    if (f)
        f();
}

/* Perturb an output; 1 when p is one (so only the first output is). */
static int perturb_float(float **p)
{
    if (*p) { /* through the backend's copies: its memory may be device memory */
        float v;
        nd_backend_download(real, &v, *p, sizeof v);
        v = v * (1.0f + 1e-3f) + 1e-3f;
        nd_backend_upload(real, *p, &v, sizeof v);
    }
    return 1;
}

static int perturb_int(int32_t **p)
{
    if (*p) {
        int32_t v;
        nd_backend_download(real, &v, *p, sizeof v);
        v = v > 0 ? v - 1 : v + 1; /* another valid slot */
        nd_backend_upload(real, *p, &v, sizeof v);
    }
    return 1;
}

static int perturb_none(const void *p)
{
    (void)p;
    return 0;
}

static void brk_sync(const nd_backend *be)
{
    (void)be;
    flush();
    nd_backend_sync(real);
}

static void *brk_alloc(const nd_backend *be, size_t bytes)
{
    (void)be;
    return real->alloc(real, bytes);
}

static void brk_free(const nd_backend *be, void *p)
{
    (void)be;
    real->free(real, p);
}

/* the copies keep issue order with a deferred op */
static void brk_upload(const nd_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    flush();
    nd_backend_upload(real, dst, src, bytes);
}

static void brk_download(const nd_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    flush();
    nd_backend_download(real, dst, src, bytes);
}

static void brk_zero(const nd_backend *be, void *dst, size_t bytes)
{
    (void)be;
    flush();
    nd_backend_zero(real, dst, bytes);
}

static int brk_supports(const nd_backend *be, enum nd_op op)
{
    (void)be;
    return real->supports(real, op);
}

/* per parameter (type, p) of an op: its field in the deferred call, the
 * field read back, stored, and the perturbation of the first output */
#define BRK_FIELD(type, p) type p;
#define BRK_READ(type, p) brk_a_->p
#define BRK_STORE(type, p) brk_a_->p = p;
#define BRK_PERTURB(type, p)                                                                       \
    if (!brk_done_)                                                                                \
        brk_done_ = _Generic((p), float *: perturb_float, int32_t *: perturb_int,                  \
                             default: perturb_none)(&(p));

#define ND_OP(name, kind, ...)                                                                     \
    static struct brk_args_##name {                                                                \
        ND_OP_MAP(BRK_FIELD, ND_OP_NOSEP, __VA_ARGS__)                                             \
    } arg_##name;                                                                                  \
    static void run_##name(void)                                                                   \
    {                                                                                              \
        const struct brk_args_##name *brk_a_ = &arg_##name;                                        \
        real->name(real, ND_OP_MAP(BRK_READ, ND_OP_COMMA, __VA_ARGS__));                           \
    }                                                                                              \
    static void brk_##name(const nd_backend *be, ND_OP_PARAMS(__VA_ARGS__))                        \
    {                                                                                              \
        (void)be;                                                                                  \
        if (deferred == ND_OP_##name) {                                                            \
            struct brk_args_##name *brk_a_ = &arg_##name;                                          \
            flush();                                                                               \
            ND_OP_MAP(BRK_STORE, ND_OP_NOSEP, __VA_ARGS__)                                         \
            pending = run_##name;                                                                  \
            return;                                                                                \
        }                                                                                          \
        real->name(real, ND_OP_ARGS(__VA_ARGS__));                                                 \
        if (broken == ND_OP_##name) {                                                              \
            int brk_done_ = 0;                                                                     \
            ND_OP_MAP(BRK_PERTURB, ND_OP_NOSEP, __VA_ARGS__)                                       \
        }                                                                                          \
    }
#include "backend/ops.def"
#undef ND_OP

const nd_backend *bo_break(const nd_backend *be, const char *name)
{
    int defer = !strncmp(name, "defer:", 6);
    enum nd_op op = nd_op_from_name(defer ? name + 6 : name);
    if (op == ND_OP_COUNT)
        return NULL;
    real = be;
    if (defer)
        deferred = op;
    else
        broken = op;
    wrapped = *be;
    wrapped.sync = brk_sync;
    wrapped.alloc = brk_alloc;
    wrapped.free = brk_free;
    wrapped.upload = brk_upload;
    wrapped.download = brk_download;
    wrapped.zero = brk_zero;
    wrapped.supports = be->supports ? brk_supports : NULL;
#define ND_OP(name, kind, ...) wrapped.name = be->name ? brk_##name : NULL;
#include "backend/ops.def"
#undef ND_OP
    return &wrapped;
}

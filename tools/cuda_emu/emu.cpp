#include "cuda_runtime.h"

#include <signal.h>
#include <unistd.h>

namespace emu
{
dim3 threadIdx_, blockIdx_, blockDim_, gridDim_;
std::map<uintptr_t, std::pair<size_t, cudaMemoryType>> &allocs()
{
    static std::map<uintptr_t, std::pair<size_t, cudaMemoryType>> m;
    return m;
}

#define STACK (256 * 1024)
struct coro {
    jmp_buf jb;
    int started, done;
};
struct warp_state {
    long gen;
    int arrived, live;
    double buf[2][32];
};
static std::vector<coro> cos;
static std::vector<char *> stacks;
static std::vector<warp_state> warps;
static std::vector<char> shared_buf;
static int cur, nlive, bar_arrived;
static long bar_gen;
static jmp_buf sched_jb;
static void (*g_body)(void *);
static void *g_ctx;

static std::vector<std::function<void()>> &queue()
{
    static std::vector<std::function<void()>> q;
    return q;
}

void enqueue(std::function<void()> work)
{
    queue().push_back(std::move(work));
}

size_t &allocated()
{
    static size_t n;
    return n;
}

static size_t page_round(size_t n)
{
    size_t pg = 4096;
    return (n + pg - 1) / pg * pg;
}

/* device memory open to the emulated device (1) or closed to the host (0) */
static void device_access(int open)
{
    for (auto &a : allocs())
        if (a.second.second == cudaMemoryTypeDevice &&
            mprotect((void *)a.first, page_round(a.second.first ? a.second.first : 1),
                     open ? PROT_READ | PROT_WRITE : PROT_NONE)) {
            perror("emu: mprotect");
            abort();
        }
}

static void on_segv(int, siginfo_t *si, void *)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    for (auto &e : allocs())
        if (e.second.second == cudaMemoryTypeDevice && a >= e.first &&
            a < e.first + page_round(e.second.first)) {
            char msg[160];
            int n = snprintf(msg, sizeof msg,
                             "emu: host code touched device memory at %p (cudaMalloc block %p, "
                             "%zu bytes): copy it with cudaMemcpy instead\n",
                             si->si_addr, (void *)e.first, e.second.first);
            if (write(2, msg, (size_t)n) < 0) {
            }
            abort();
        }
    signal(SIGSEGV, SIG_DFL); /* anything else: the usual crash */
    raise(SIGSEGV);
}

void *device_alloc(size_t n)
{
    static int handler;
    if (!handler) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
        handler = 1;
    }
    void *p = mmap(NULL, page_round(n ? n : 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("emu: mmap");
        abort();
    }
    memset(p, 0x7f, n); /* garbage, not zeros: alloc must zero it itself */
    if (mprotect(p, page_round(n ? n : 1), PROT_NONE)) {
        perror("emu: mprotect");
        abort();
    }
    return p;
}

void device_free(void *p, size_t n)
{
    munmap(p, page_round(n ? n : 1));
}

void drain()
{
    /* taking the list first: work never enqueues more, but be safe */
    std::vector<std::function<void()>> q;
    q.swap(queue());
    if (q.empty())
        return;
    device_access(1);
    for (auto &w : q)
        w();
    device_access(0);
}

void *dyn_shared()
{
    return shared_buf.data();
}

static void yield()
{
    if (!_setjmp(cos[cur].jb))
        _longjmp(sched_jb, 1);
}

void sync_block()
{
    long gen = bar_gen;
    if (++bar_arrived == nlive) {
        bar_arrived = 0;
        bar_gen++;
        return;
    }
    while (bar_gen == gen)
        yield();
}

double warp_xchg(double v, int src, int mode)
{
    int t = cur, lane = t & 31;
    warp_state &W = warps[t >> 5];
    long gen = W.gen;
    int par = gen & 1;
    W.buf[par][lane] = v;
    if (++W.arrived == W.live) {
        W.arrived = 0;
        W.gen++;
    } else
        while (W.gen == gen)
            yield();
    int from = (mode ? (lane ^ src) : src) & 31;
    return warps[t >> 5].buf[par][from];
}

int warp_any(int p)
{
    int t = cur, lane = t & 31;
    warp_state &W = warps[t >> 5];
    long gen = W.gen;
    int par = gen & 1;
    W.buf[par][lane] = p ? 1.0 : 0.0;
    if (++W.arrived == W.live) {
        W.arrived = 0;
        W.gen++;
    } else
        while (W.gen == gen)
            yield();
    int any = 0;
    int base = (t >> 5) * 32, n = (int)cos.size() - base;
    for (int l = 0; l < 32 && l < n; l++)
        any |= warps[t >> 5].buf[par][l] != 0.0;
    return any;
}

static void entry()
{
    g_body(g_ctx);
    cos[cur].done = 1;
    nlive--;
    if (bar_arrived > 0 && bar_arrived == nlive) {
        bar_arrived = 0;
        bar_gen++;
    }
    warp_state &W = warps[cur >> 5];
    W.live--;
    if (W.arrived > 0 && W.arrived == W.live) {
        W.arrived = 0;
        W.gen++;
    }
    _longjmp(sched_jb, 1);
}

void launch_impl(dim3 grid, dim3 block, size_t shmem, void (*body)(void *), void *ctx)
{
    int n = (int)(block.x * block.y * block.z);
    if (block.y != 1 || block.z != 1 || n > 1024 || grid.z != 1) {
        fprintf(stderr, "emu: unsupported launch\n");
        abort();
    }
    g_body = body;
    g_ctx = ctx;
    blockDim_ = block;
    gridDim_ = grid;
    shared_buf.assign(shmem + 16, (char)0x7f);
    while ((int)stacks.size() < n)
        stacks.push_back((char *)malloc(STACK));
    cos.assign(n, coro());
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx_ = dim3(bx, by, 0);
            for (auto &c : cos)
                c.started = c.done = 0;
            warps.assign((n + 31) / 32, warp_state());
            for (int w = 0; w < (int)warps.size(); w++)
                warps[w].live = n - 32 * w < 32 ? n - 32 * w : 32;
            nlive = n;
            bar_arrived = 0;
            while (nlive > 0) {
                for (int i = 0; i < n; i++) {
                    if (cos[i].done)
                        continue;
                    cur = i;
                    threadIdx_ = dim3(i, 0, 0);
                    if (!_setjmp(sched_jb)) {
                        if (!cos[i].started) {
                            cos[i].started = 1;
                            static ucontext_t uc;
                            getcontext(&uc);
                            uc.uc_stack.ss_sp = stacks[i];
                            uc.uc_stack.ss_size = STACK;
                            uc.uc_link = 0;
                            makecontext(&uc, entry, 0);
                            setcontext(&uc);
                        } else
                            _longjmp(cos[i].jb, 1);
                    }
                }
            }
        }
}
} // namespace emu

/* The training run object (train/run.h) on the built-in nano base:
 *   - open / plan / step give the same adapter as nd_finetune;
 *   - a stop request returns ND_EINTERRUPT before the step and writes
 *     nothing; nd_finetune then saves what it has and returns ND_EINTERRUPT
 *     (an interrupt was ND_EIO before, indistinguishable from a failed read);
 *   - a run without an output (bench finetune's) steps and saves nothing. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/status.h"
#include "testutil.h"
#include "train/finetune.h"
#include "train/run.h"

static void opts(nd_finetune_opts *o, const char *out, volatile int *stop)
{
    nd_finetune_defaults(o);
    o->data = "examples/data.jsonl";
    o->checkpoint = "models/needle-nano.pkl";
    o->tokenizer = "models/tokenizer.model";
    o->out = out;
    o->epochs = 1;
    o->batch_size = 4;
    o->rank = 2;
    o->max_len = 192;
    o->val_split = 0.1;
    o->be = nd_backend_cpu(1);
    o->stop = stop;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

int main(void)
{
    if (access("models/needle-nano.pkl", R_OK) || access("models/tokenizer.model", R_OK) ||
        access("examples/data.jsonl", R_OK)) {
        fprintf(stderr, "models/needle-nano.pkl, models/tokenizer.model or examples/data.jsonl "
                        "missing\n");
        return 1;
    }
    char dir[] = "/tmp/needle_run_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/a.pkl", dir);
    snprintf(b, sizeof b, "%s/b.pkl", dir);
    volatile int stop = 0;
    nd_finetune_opts o;

    /* two steps by hand, then a stop request */
    opts(&o, a, &stop);
    nd_run *r = NULL;
    int rc = nd_run_open(&r, &o);
    CHECK_MSG(rc == 0, "%s", rc ? nd_last_error() : "");
    if (rc)
        return tu_finish("test_train_run");
    rc = nd_run_plan(r);
    CHECK_MSG(rc == 0, "%s", rc ? nd_last_error() : "");
    nd_run_step_info si;
    for (int s = 0; s < 2 && !rc; s++) {
        rc = nd_run_step(r, &si);
        CHECK_MSG(rc == 0 && si.step == s + 1 && isfinite(si.loss) && si.rows == 4, "%d %s", rc,
                  rc ? nd_last_error() : "");
    }
    long total = r->total;
    CHECK(total > 2);
    stop = 2; /* SIGINT */
    rc = nd_run_step(r, &si);
    CHECK_MSG(rc == ND_EINTERRUPT && strstr(nd_last_error(), "interrupted at step 2/"), "%d %s", rc,
              nd_last_error());
    CHECK(!exists(a)); /* an interrupt writes nothing by itself */
    CHECK(nd_run_save(r, 0) == 0 && exists(a));
    nd_run_close(r);

    /* nd_finetune stopped after two steps: ND_EINTERRUPT, the same adapter */
    stop = 0;
    opts(&o, b, &stop);
    o.stop_after = 2;
    rc = nd_finetune(&o);
    CHECK_MSG(rc == ND_EINTERRUPT && strstr(nd_last_error(), "so far written to") && stop == -1,
              "%d %s", rc, nd_last_error());
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    CHECK(fa && fb);
    if (fa && fb) {
        int same = 1, ca, cb;
        do {
            ca = fgetc(fa);
            cb = fgetc(fb);
            same &= ca == cb;
        } while (ca != EOF && cb != EOF);
        CHECK_MSG(same, "the run object's adapter differs from nd_finetune's");
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);

    /* no output: steps run, nothing is written anywhere */
    opts(&o, NULL, NULL);
    o.val_split = 0;
    rc = nd_run_open(&r, &o);
    if (!rc)
        rc = nd_run_plan(r);
    if (!rc)
        rc = nd_run_step(r, &si);
    CHECK_MSG(rc == 0 && r->n_val == 0 && si.step == 1, "%d %s", rc, rc ? nd_last_error() : "");
    CHECK(nd_run_save(r, 1) == 0);
    nd_run_close(r);

    unlink(a);
    unlink(b);
    rmdir(dir);
    return tu_finish("test_train_run");
}

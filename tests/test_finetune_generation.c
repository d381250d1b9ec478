/* nd_finetune renders its data with the generation it is given
 * (nd_finetune_opts.generation): rows that only one of the two templates
 * accepts decide which one ran, on the built-in nano base. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/status.h"
#include "testutil.h"
#include "train/finetune.h"

static char lines[64][1024];
static int n_lines;

static void emit(void *ctx, const char *line)
{
    (void)ctx;
    if (n_lines < 64)
        snprintf(lines[n_lines++], sizeof lines[0], "%s", line);
}

static const char *find_line(const char *word)
{
    for (int i = 0; i < n_lines; i++)
        if (strstr(lines[i], word))
            return lines[i];
    return NULL;
}

/* One finetune step over `data` with `gen`; returns nd_finetune's code. */
static int run(const char *dir, const char *data, int gen)
{
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/data.jsonl", dir);
    snprintf(out, sizeof out, "%s/lora.pkl", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(data, f);
    fclose(f);
    nd_finetune_opts o;
    nd_finetune_defaults(&o);
    volatile int stop = 0;
    o.data = path;
    o.checkpoint = "models/needle-nano.pkl";
    o.tokenizer = "models/tokenizer.model";
    o.out = out;
    o.epochs = 1;
    o.batch_size = 2;
    o.rank = 2;
    o.val_split = 0;
    o.be = nd_backend_cpu(1);
    o.emit = emit;
    o.stop = &stop;
    o.stop_after = 1;
    o.generation = gen;
    n_lines = 0;
    int rc = nd_finetune(&o);
    unlink(path);
    unlink(out);
    return rc;
}

int main(void)
{
    if (access("models/needle-nano.pkl", R_OK) || access("models/tokenizer.model", R_OK)) {
        fprintf(stderr, "models/needle-nano.pkl or models/tokenizer.model missing\n");
        return 1;
    }
    char dir[] = "/tmp/needle_ftgen_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    /* null reasoning: Needle 3's (reasoning or "") takes it, Needle 2 refuses */
    const char *null_reasoning = "{\"query\":\"hi\",\"reasoning\":null,\"answers\":[]}\n"
                                 "{\"query\":\"ho\",\"answers\":[]}\n";
    CHECK(run(dir, null_reasoning, 2) != 0 &&
          strstr(nd_last_error(), "reasoning must be a string"));
    CHECK(run(dir, null_reasoning, 0) != 0 &&
          strstr(nd_last_error(), "reasoning must be a string"));
    int rc = run(dir, null_reasoning, 3);
    CHECK_MSG(rc == 0, "generation 3: %s", rc ? nd_last_error() : "");
    CHECK(find_line("2 examples") != NULL);
    /* a lone surrogate in answers: escaped by Needle 2, refused by Needle 3 */
    const char *surrogate = "{\"query\":\"hi\",\"answers\":[{\"name\":\"\\ud800\"}]}\n"
                            "{\"query\":\"ho\",\"answers\":[]}\n";
    rc = run(dir, surrogate, 2);
    CHECK_MSG(rc == 0, "generation 2: %s", rc ? nd_last_error() : "");
    CHECK(run(dir, surrogate, 3) != 0 && strstr(nd_last_error(), "data.jsonl:1: answers"));
    CHECK(run(dir, surrogate, 5) != 0 && strstr(nd_last_error(), "generation 5"));
    rmdir(dir);
    return tu_finish("test_finetune_generation");
}

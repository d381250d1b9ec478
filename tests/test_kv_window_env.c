/* $NEEDLE_KV_WINDOW and `needle run --kv-window N` (issue 36): a session
 * keeps and attends to the last N positions instead of the archive
 * header's kv_window, its memory bound shrinks with N, a long conversation
 * under a small window still answers and stays at that window, and a bad
 * value is an error that names the variable (library) or the flag (CLI). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/rng.h"
#include "core/status.h"
#include "engine/engine.h"
#include "model/san.h"
#include "needle.h"
#include "testutil.h"

static const char *TOOLS = "[{\"name\": \"set_timer\", \"description\": \"start a timer\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"minutes\": "
                           "{\"type\": \"integer\"}}, \"required\": [\"minutes\"]}}]";

/* a session under the current environment: its window and memory bound;
 * with turns > 0 that many turns are answered first */
static int session_window(needle_model *M, int turns, long long *bound, int *evicted)
{
    needle_session *S = needle_session_new(M, "You are a home assistant.", TOOLS);
    if (!S)
        return -1;
    char buf[8192];
    for (int t = 0; t < turns; t++) {
        int rc = needle_session_complete(S, "set a timer for five minutes please", 24, buf,
                                         (int)sizeof buf);
        CHECK_MSG(rc >= 0 && buf[0] == '{', "turn %d: rc %d %s", t, rc, needle_session_error(S));
    }
    const nd_kv_state *kv = nd_session_kv(S);
    int w = kv->kv_window;
    *bound = needle_session_memory_bound(S);
    *evicted = (int)kv->evicted;
    needle_session_free(S);
    return w;
}

/* exit status of `$NEEDLE run --weights arch --tools tools <extra>` */
static int run_cli(const char *needle, const char *arch, const char *tools, const char *extra)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' run --weights '%s' --tools '%s' %s >/dev/null 2>&1", needle,
             arch, tools, extra);
    int st = system(cmd);
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

int main(void)
{
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_kv_window_env: %s\n", nd_last_error());
        return 1;
    }
    san_config c;
    san_config_preset(&c, "tiny");
    c.engram_slots = 256;
    c.max_seq_len = 512;
    san_model src;
    CHECK(san_model_create(&src, &c) == 0);
    san_model_init_random(&src, 5);
    size_t len;
    unsigned char *arch = tu_archive(&src, tok, 4, 256, &len);
    needle_model *M = needle_model_load_buffer(arch, len);
    CHECK_MSG(M, "%s", needle_thread_error());
    if (!M)
        return tu_finish("test_kv_window_env");

    long long b_header, b_small, b_env;
    int ev;
    unsetenv("NEEDLE_KV_WINDOW");
    CHECK(session_window(M, 0, &b_header, &ev) == 256);
    setenv("NEEDLE_KV_WINDOW", "48", 1);
    /* enough turns to slide the small window several times */
    int w = session_window(M, 12, &b_small, &ev);
    CHECK_MSG(w == 48, "window %d under NEEDLE_KV_WINDOW=48", w);
    CHECK_MSG(ev > 0, "a 48-position window never slid (%d evicted)", ev);
    CHECK(session_window(M, 0, &b_env, &ev) == 48);
    CHECK_MSG(b_env < b_header, "memory bound %lld at window 48, %lld at 256", b_env, b_header);
    setenv("NEEDLE_KV_WINDOW", "1000", 1); /* wider than the header's: taken as asked */
    CHECK(session_window(M, 0, &b_env, &ev) == 1000);
    static const char *bad[] = {"0", "-4", "12x", "99999999999"};
    for (int i = 0; i < 4; i++) {
        setenv("NEEDLE_KV_WINDOW", bad[i], 1);
        CHECK_MSG(session_window(M, 0, &b_env, &ev) == -1, "NEEDLE_KV_WINDOW=%s accepted", bad[i]);
        CHECK(strstr(needle_thread_error(), "NEEDLE_KV_WINDOW") != NULL);
    }
    unsetenv("NEEDLE_KV_WINDOW");

    /* the CLI flag */
    const char *needle = getenv("NEEDLE");
    if (needle && *needle) {
        char dir[] = "/tmp/needle_kvwXXXXXX";
        CHECK(mkdtemp(dir) != NULL);
        char ap[64], tp[64];
        snprintf(ap, sizeof ap, "%s/m.cact", dir);
        snprintf(tp, sizeof tp, "%s/tools.json", dir);
        FILE *f = fopen(ap, "wb");
        CHECK(f && fwrite(arch, 1, len, f) == len);
        if (f)
            fclose(f);
        f = fopen(tp, "w");
        CHECK(f && fputs(TOOLS, f) >= 0);
        if (f)
            fclose(f);
        CHECK(run_cli(needle, ap, tp, "--kv-window 64 --max-new-tokens 16 'timer for 5'") == 0);
        CHECK(run_cli(needle, ap, tp, "--kv-window 0 'timer for 5'") == 2);
        CHECK(run_cli(needle, ap, tp, "--kv-window many 'timer for 5'") == 2);
        unlink(ap);
        unlink(tp);
        rmdir(dir);
    } else {
        printf("test_kv_window_env: $NEEDLE unset, CLI part not run\n");
    }
    needle_model_free(M);
    free(arch);
    san_model_free(&src);
    nd_tokenizer_free(tok);
    return tu_finish("test_kv_window_env");
}

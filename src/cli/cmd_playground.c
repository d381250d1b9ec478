/* needle playground: a local web UI (upstream needle/playground) served by
 * this program; the server lives in src/cli/playground/. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "needle.h"
#ifdef NEEDLE_HAVE_PLAYGROUND
#include "cli/playground/playground.h"
#endif

static const char *playground_usage =
    "usage: needle playground [--weights X.cact] [--port 7860] [--host 127.0.0.1]\n"
    "                         [--base CKPT.pkl] [--tokenizer FILE] [--workdir DIR]\n"
    "                         [--max-new-tokens N] [--allow-origin ORIGIN]...\n";
static const char *playground_about =
    "Serve a local web page to declare tools, chat with the model and see each\n"
    "call envelope, upload a .cact, and fine-tune -> build -> hot-load with live\n"
    "progress. Routes (upstream's): GET / /model /finetune/status /download/NAME,\n"
    "POST /complete /reset /load-model /finetune.\n";
static const char *playground_epilog =
    "Who it answers: only requests whose Host is the address it listens on\n"
    "(127.0.0.1:PORT, localhost:PORT, [::1]:PORT on loopback) or an --allow-origin\n"
    "name, else 403 (a DNS-rebinding page cannot read or drive it); a POST with an\n"
    "Origin must come from that same origin (403 otherwise) and carry Content-Type\n"
    "application/json (application/octet-stream for /load-model; 415 otherwise),\n"
    "which another site's page cannot send without a CORS preflight this server\n"
    "never grants. See docs/security.md.\n"
    "\n"
    "Limits: 64 MB for a .cact upload, 1 MB for JSON bodies (413 beyond), 128 MB\n"
    "for all bodies being received at once (503 beyond); 256 connections served by\n"
    "6 event-loop threads, at most 4 model requests (/complete, /load-model) at\n"
    "once (503 beyond); a request's headers must arrive within 10 s and its body\n"
    "within 120 s, and a connection idle for 30 s is closed. One\n"
    "fine-tune at a time (409 while one runs); it runs this binary as `needle\n"
    "finetune` then `needle build` child processes. A .cact that does not load\n"
    "answers 400 and the loaded model stays. SIGINT/SIGTERM stop the server (and a\n"
    "running fine-tune) cleanly.\n";

int cli_playground(int argc, char **argv)
{
    const char *weights = NULL, *host = "127.0.0.1", *base = NULL;
    const char *tokenizer = NULL, *workdir = NULL;
    cli_strlist origins = {{0}, 0};
    long long port = 7860, max_new = 256;
    cli_opt opts[] = {
        {"--weights", CLI_PATH, &weights, 0, 0, "PATH", NULL,
         ".cact archive to start with (default: the built-in base, needle-nano.cact, when "
         "installed; else upload one)",
         0, 0},
        {"--port", CLI_I64, &port, 0, 65535, "N", NULL,
         "TCP port (default 7860; 0 picks a free one)", 0, 0},
        {"--host", CLI_STR, &host, 0, 0, "ADDR", NULL,
         "numeric address to bind (default 127.0.0.1); anything but loopback is warned about: the "
         "page has no authentication",
         0, 0},
        {"--allow-origin", CLI_LIST, &origins, 0, 0, "ORIGIN", NULL,
         "also answer requests for, and POSTs from, this origin (http[s]://HOST[:PORT]): the name "
         "the page is served under through a reverse proxy or on the LAN. Repeatable",
         0, 0},
        {"--base", CLI_PATH, &base, 0, 0, "PATH", NULL,
         "base checkpoint the fine-tune trains on (default checkpoints/needle2.pkl when it is "
         "there, else the nano base installed with needle)",
         0, 0},
        CLI_OPT_TOKENIZER(&tokenizer, "SentencePiece model for fine-tune and build (default "
                                      "$NEEDLE_TOKENIZER, else tokenizer.model beside --base)"),
        {"--workdir", CLI_DIR, &workdir, 0, 0, "DIR", NULL,
         "where fine-tune files are written and served from (default a new directory under "
         "$TMPDIR or /tmp)",
         0, 0},
        {"--max-new-tokens", CLI_I64, &max_new, 1, 1 << 20, "N", NULL,
         "generation budget per query (default 256)", 0, 0},
    };
    cli_cmd cmd = {"playground",
                   playground_usage,
                   playground_about,
                   playground_epilog,
                   opts,
                   CLI_NOPTS(opts),
                   0,
                   {0},
                   0};
    CLI_PARSE(&cmd, argc, argv);
    const char *const *allow = origins.v;
    size_t n_allow = origins.n;
#ifndef NEEDLE_HAVE_PLAYGROUND
    (void)weights, (void)host, (void)base, (void)tokenizer, (void)workdir, (void)allow,
        (void)n_allow;
    fprintf(stderr, "needle playground: this build has no playground (configure with "
                    "libmicrohttpd installed: Debian libmicrohttpd-dev)\n");
    return 1;
#else
    sigset_t stop;
    pg_block_stop_signals(&stop); /* before the model load starts any thread */
    /* tokenizer: the flag, else $NEEDLE_TOKENIZER, else beside the base */
    static char tok_buf[PATH_MAX], base_buf[PATH_MAX], weights_buf[PATH_MAX];
    /* as upstream's playground: the built-in base answers until another is loaded */
    if (!weights && needle_default_weights_path(weights_buf, sizeof weights_buf) == NEEDLE_OK) {
        weights = weights_buf;
        fprintf(stderr,
                "needle playground: model %s (the built-in base; --weights X.cact for "
                "another)\n",
                weights);
    }
    struct stat st;
    if (!base)
        base = cli_default_base(stderr, "--base PATH", base_buf, sizeof base_buf);
    if (!tokenizer)
        tokenizer = getenv("NEEDLE_TOKENIZER");
    if (!tokenizer) {
        const char *slash = strrchr(base, '/');
        snprintf(tok_buf, sizeof tok_buf, "%.*stokenizer.model",
                 slash ? (int)(slash - base + 1) : 0, base);
        if (!stat(tok_buf, &st))
            tokenizer = tok_buf;
    }
    static char work_buf[PATH_MAX];
    if (!workdir) {
        const char *tmp = getenv("TMPDIR");
        snprintf(work_buf, sizeof work_buf, "%s/needle-playground-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(work_buf)) {
            perror("needle playground: mkdtemp");
            return 1;
        }
        workdir = work_buf;
    } else if (stat(workdir, &st) || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "needle playground: --workdir %s: not a directory\n", workdir);
        return 1;
    }
    /* the children are this very binary */
    static char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        perror("needle playground: readlink /proc/self/exe");
        return 1;
    }
    self[n] = 0;
    if (pg_slot_init(weights, (int)max_new)) {
        if (workdir == work_buf)
            rmdir(work_buf);
        return 1;
    }
    struct pg_job_config cfg = {self, base, tokenizer, workdir};
    pg_job_configure(&cfg);
    fprintf(stderr, "needle playground: fine-tune files go to %s\n", workdir);
    int rc = pg_serve(host, (int)port, workdir, allow, n_allow);
    pg_slot_free();
    if (workdir == work_buf)
        rmdir(work_buf); /* ours and still empty: leave no trace; produced files stay */
    return rc;
#endif
}

/* needle download ORG/REPO/FILE: a file of a Hugging Face model repository,
 * as huggingface_hub fetches it (resolve URL, token, offline mode, resume,
 * checksums). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "net/hf_download.h"

static const char *download_usage =
    "usage: needle download ORG/REPO[/FILE] [--revision R] [--dir D]\n";
static const char *download_about =
    "Without FILE: the repository's one .cact archive (as upstream).\n"
    "Download FILE of the Hugging Face model repository ORG/REPO to D/FILE (the\n"
    "repository's path kept, as `huggingface-cli download --local-dir D`), e.g.\n"
    "  needle download Cactus-Compute/needle2/checkpoints/needle2.pkl\n"
    "  needle download Cactus-Compute/needle2/tokenizer/tokenizer.model\n"
    "\n"
    "The file is written to D/FILE.part and renamed when complete; an interrupted\n"
    "download resumes from the .part on the next run (HTTP Range with If-Range:\n"
    "a file that changed on the server starts over). Its size and sha256 are\n"
    "checked against what the server's first answer states (X-Linked-Size and\n"
    "X-Linked-Etag for LFS files) and a mismatch is discarded. Only http and https\n"
    "are followed; file names from the server's listing must be plain relative\n"
    "paths; a file that does not fit in the free space is refused up front.\n";
static const char *download_epilog =
    "Environment (as huggingface_hub): HF_ENDPOINT (default https://huggingface.co),\n"
    "HF_TOKEN (sent as a Bearer token for gated/private repositories, never\n"
    "printed), HF_HUB_OFFLINE=1 (no network: fail, saying what to fetch).\n"
    "NEEDLE_HF_STALL_S (default 60): a transfer under 1 KB/s for this many seconds\n"
    "ends (the repository listing also when not done within twice that).\n"
    "\n"
    "Upstream's `needle download <platform>` and `needle fetch` (prebuilt engine\n"
    "libraries) have no counterpart: build the engine here (`make`, or\n"
    "`make install PREFIX=...` for bin/needle, lib/libneedle.so and needle.pc).\n";

/* whether a '/'-separated path has a ".." segment */
static int has_dotdot(const char *path)
{
    for (const char *p = path; (p = strstr(p, "..")); p += 2)
        if ((p == path || p[-1] == '/') && (p[2] == 0 || p[2] == '/'))
            return 1;
    return 0;
}

/* ORG/REPO alone: its one .cact archive, as upstream's download */
static int pick_cact(const char *repo, const char *revision, char *file, size_t n)
{
    char **files;
    int count;
    if (nd_hf_list(repo, revision, &files, &count))
        return cli_fail(NULL);
    int cacts = 0;
    for (int i = 0; i < count; i++) {
        size_t l = strlen(files[i]);
        if (l > 5 && !strcmp(files[i] + l - 5, ".cact") && cacts++ == 0)
            snprintf(file, n, "%s", files[i]);
    }
    if (cacts != 1) {
        fprintf(stderr, "needle download: %s holds %d .cact files, name one (ORG/REPO/FILE)%s",
                repo, cacts, cacts ? ":" : "\n");
        for (int i = 0, shown = 0; i < count && cacts; i++) {
            size_t l = strlen(files[i]);
            if (l > 5 && !strcmp(files[i] + l - 5, ".cact") && shown++ < 5)
                fprintf(stderr, " %s", files[i]);
        }
        if (cacts)
            fputc('\n', stderr);
    }
    for (int i = 0; i < count; i++)
        free(files[i]);
    free(files);
    return cacts == 1 ? 0 : 1;
}

int cli_download(int argc, char **argv)
{
    const char *dir = ".", *revision = NULL;
    cli_opt opts[] = {
        {"--revision", CLI_STR, &revision, 0, 0, "R", NULL, "branch, tag or commit (default main)",
         0, 0},
        {"--dir", CLI_DIR, &dir, 0, 0, "D", NULL, "destination directory (default .)", 0, 0},
        {"--out", CLI_DIR, &dir, 0, 0, "D", NULL, "upstream's name for --dir", 0, 0},
    };
    cli_cmd cmd = {
        "download", download_usage, download_about, download_epilog, opts, CLI_NOPTS(opts), 1, {0},
        0};
    CLI_PARSE(&cmd, argc, argv);
    const char *spec = cmd.n_pos ? cmd.pos[0] : NULL;
    if (!spec)
        return cli_usage_error("download", "missing ORG/REPO/FILE");
    /* ORG/REPO/FILE: the first two non-empty segments name the repository */
    char repo[512], file[4096];
    const char *p = spec;
    while (*p == '/')
        p++;
    const char *s1 = strchr(p, '/');
    if (!s1) {
        fprintf(stderr,
                "needle download: '%s' is not ORG/REPO/FILE. Upstream's prebuilt engine "
                "folders (needle download <platform>, needle fetch) have no counterpart here: "
                "build the engine from source (`make`, or `make install PREFIX=...`); models "
                "come as `needle download ORG/REPO/FILE`\n",
                spec);
        return 2;
    }
    const char *s2 = strchr(s1 + 1, '/');
    const char *f = s2 ? s2 + 1 : "";
    while (*f == '/')
        f++;
    snprintf(repo, sizeof repo, "%.*s", s2 ? (int)(s2 - p) : (int)strlen(p), p);
    if (*f)
        snprintf(file, sizeof file, "%s", f);
    else if (pick_cact(repo, revision, file, sizeof file))
        return 1;
    /* the user's own '..' (a name from the server's listing was checked
     * by nd_hf_list, which refuses unsafe ones as the server's fault) */
    if (has_dotdot(file) || has_dotdot(repo))
        return cli_usage_error("download", "a '..' path segment is not allowed in ORG/REPO/FILE");
    char dest[8192];
    snprintf(dest, sizeof dest, "%s/%s", dir, file);
    nd_hf_opts o = {revision, stderr};
    if (nd_hf_download(repo, file, dest, &o, NULL))
        return cli_fail(NULL);
    struct stat st;
    double mb = stat(dest, &st) == 0 ? (double)st.st_size / 1e6 : 0;
    printf("  %-9s %s  %.2f MB\n", "file", dest, mb);
    return 0;
}

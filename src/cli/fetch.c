/* Upstream's automatic Hugging Face fetches (needle/model/run.py
 * load_checkpoint, needle/model/tokenizer.py get_tokenizer): a missing base
 * checkpoint or tokenizer is downloaded from Cactus-Compute/needle2. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/status.h"
#include "net/hf_download.h"

int cli_fetch_checkpoint(const char *path, char *resolved, size_t n)
{
    snprintf(resolved, n, "%s", path);
    if (access(path, F_OK) == 0)
        return 0;
    /* the repository keeps checkpoints under checkpoints/: try the path as
     * given below it, then its basename; saved relative to the current
     * directory (hf_hub_download(local_dir=".")) */
    char names[2][4096];
    int count = 0;
    const char *rel = path;
    while (!strncmp(rel, "./", 2))
        rel += 2;
    if (path[0] != '/')
        snprintf(names[count++], sizeof names[0], "%s%s",
                 strncmp(rel, "checkpoints/", 12) ? "checkpoints/" : "", rel);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(names[count], sizeof names[0], "checkpoints/%s", base);
    if (!count || strcmp(names[0], names[1]))
        count++;
    for (int i = 0; i < count; i++)
        if (access(names[i], F_OK) == 0) { /* fetched before */
            snprintf(resolved, n, "%s", names[i]);
            return 0;
        }
    printf("  %-9s %s  downloading from Hugging Face\n", "fetch", path);
    fflush(stdout);
    nd_hf_opts o = {NULL, stderr};
    for (int i = 0; i < count; i++) {
        int not_found = 0;
        if (nd_hf_download(ND_HF_NEEDLE_REPO, names[i], names[i], &o, &not_found) == ND_OK) {
            snprintf(resolved, n, "%s", names[i]);
            return 0;
        }
        if (!not_found || i + 1 == count)
            break;
    }
    fprintf(stderr, "needle: %s: not found locally, and the download failed: %s\n", path,
            nd_last_error());
    return 1;
}

const char *cli_hf_repo(int generation)
{
    return generation == 3 ? ND_HF_NEEDLE3_REPO : ND_HF_NEEDLE_REPO;
}

int cli_fetch_tokenizer(const char *dest, int generation)
{
    const char *repo = cli_hf_repo(generation);
    printf("  %-9s tokenizer  downloading from Hugging Face %s\n", "fetch", repo);
    fflush(stdout);
    nd_hf_opts o = {NULL, stderr};
    if (nd_hf_download(repo, "tokenizer/tokenizer.model", dest, &o, NULL) == ND_OK)
        return 0;
    fprintf(stderr, "needle: no tokenizer, and the download failed: %s\n", nd_last_error());
    return 1;
}

/* Files from a Hugging Face model repository over HTTPS (libcurl), with
 * huggingface_hub's conventions: HF_ENDPOINT (default
 * https://huggingface.co), HF_TOKEN (sent as "Authorization: Bearer", never
 * printed), HF_HUB_OFFLINE=1 (no network), the resolve URL layout
 * {endpoint}/{repo}/resolve/{revision}/{file} (redirects followed).
 *
 * A download goes to DEST.part, resumes an existing DEST.part with an HTTP
 * Range request guarded by If-Range (the ETag or Last-Modified the .part
 * came with, kept in DEST.part.validator; without one it starts over),
 * checks the size and the sha256 the first answer states (X-Linked-Size /
 * X-Linked-Etag of LFS files; Content-Length and the ETag, git's blob id,
 * otherwise) and is renamed to DEST only when they match. Redirects go to
 * http/https only, stalls end the transfer (NEEDLE_HF_STALL_S), a stated
 * size beyond the free space is refused up front, and any text of the
 * server's in a message is escaped: docs/security.md, "The downloader". */
#ifndef ND_HF_DOWNLOAD_H
#define ND_HF_DOWNLOAD_H

#include <stdio.h>

#define ND_HF_DEFAULT_ENDPOINT "https://huggingface.co"
/* upstream's model repository (needle/model/tokenizer.py HF_REPO) */
#define ND_HF_NEEDLE_REPO "Cactus-Compute/needle2"
#define ND_HF_NEEDLE3_REPO "Cactus-Compute/needle3"

typedef struct {
    const char *revision; /* NULL: "main" */
    FILE *progress;       /* NULL: silent; a bar when a tty, else periodic lines */
} nd_hf_opts;

/* Download repo's `file` to `dest` (parent directories created). Returns
 * ND_OK, or an ND_E* code with nd_last_error() saying what failed, from
 * where, and what to do (offline: what to fetch, from where, where to put
 * it). A 404 gives ND_EIO and sets *not_found (may be NULL). */
int nd_hf_download(const char *repo, const char *file, const char *dest, const nd_hf_opts *o,
                   int *not_found);

/* The repository's file names at a revision ({endpoint}/api/models/{repo}/
 * revision/{rev}, "siblings"): a NULL-terminated malloc'd array (free each
 * and the array) and its length. A listing holding an unsafe name (see
 * nd_hf_name_check) is refused whole with ND_EFORMAT. */
int nd_hf_list(const char *repo, const char *revision, char ***files, int *count);

/* The URL nd_hf_download would fetch (for messages). */
void nd_hf_url(const char *repo, const char *file, const char *revision, char *buf, size_t n);

/* Whether HF_HUB_OFFLINE asks for no network (1/true/yes/on). */
int nd_hf_offline(void);

#endif

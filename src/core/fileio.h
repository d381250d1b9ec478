/* Whole-file reads and atomic writes (temp file in the same directory,
 * fsync, rename), so a crash never leaves a half-written output. */
#ifndef ND_FILEIO_H
#define ND_FILEIO_H

#include <stddef.h>

/* Read a whole file into a malloc'd buffer (one extra NUL byte appended,
 * not counted in *len). Refuses files over max_bytes (0 = 16 GiB). */
int nd_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len);

/* Atomically replace `path` with `len` bytes from `data`. */
int nd_write_file_atomic(const char *path, const void *data, size_t len);

/* Streaming variant: nd_atomic_open gives a FILE* on a temp file beside
 * `path`; nd_atomic_commit flushes, fsyncs, closes and renames it;
 * nd_atomic_abort closes and removes it. */
typedef struct {
    void *fp; /* FILE* */
    char *tmp_path;
    char *path;
} nd_atomic_file;

int nd_atomic_open(nd_atomic_file *af, const char *path);
int nd_atomic_commit(nd_atomic_file *af);
void nd_atomic_abort(nd_atomic_file *af);

#endif

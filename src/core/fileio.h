/* Whole-file reads and atomic writes (temp file in the same directory,
 * fsync, rename, fsync of the directory), so a crash never leaves a
 * half-written output: the path holds either the old file or the whole new
 * one.
 *
 * Outputs are only ever regular files: a path that names a symbolic link,
 * a device, a FIFO, a socket or a directory is refused (never replaced).
 * A replaced file keeps its permission bits; a new one gets 0666 & ~umask.
 * The temporary file is ".<name>.tmp.<pid>" beside the output; temporaries
 * of the same output left by processes that no longer exist (a killed save)
 * are removed by the next save. */
#ifndef ND_FILEIO_H
#define ND_FILEIO_H

#include <stddef.h>
#include <sys/types.h>

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
    int err; /* errno of the first failed write, 0 if none */
} nd_atomic_file;

int nd_atomic_open(nd_atomic_file *af, const char *path);
/* fwrite to the temp file; on failure records the system's reason and
 * returns ND_EIO with "PATH: write failed: <strerror>". */
int nd_atomic_write(nd_atomic_file *af, const void *data, size_t len);
int nd_atomic_commit(nd_atomic_file *af);
void nd_atomic_abort(nd_atomic_file *af);

/* Whether directory `dir` exists or `mkdir -p` could make it: the nearest
 * existing ancestor is a directory we may write into. ND_EIO naming `what`
 * ("checkpoint directory") and the reason otherwise. */
int nd_dir_creatable(const char *dir, const char *what);
/* mkdir -p `dir`; ND_EIO naming `what` on failure. */
int nd_mkdirs(const char *dir, const char *what);

/* May `path` be written as an output? ND_OK when it does not exist or is
 * a regular file (then *exists = 1, *mode its st_mode); an error naming
 * what it is otherwise (symlink, device, FIFO, directory). */
int nd_output_check(const char *path, int *exists, mode_t *mode);
/* nd_output_check, then create and remove a temporary file beside `path`:
 * proves the directory exists and is writable before long work starts. */
int nd_check_writable(const char *path);
/* 1 when a and b both exist and are the same file (device and inode, links
 * followed), else 0. */
int nd_same_file(const char *a, const char *b);

#endif

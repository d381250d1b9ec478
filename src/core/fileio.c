#define _POSIX_C_SOURCE 200809L
#include "core/fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

int nd_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    if (!max_bytes)
        max_bytes = (size_t)16 << 30;
    FILE *f = fopen(path, "rb");
    if (!f)
        return nd_error(ND_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return nd_error(ND_EIO, "%s: not a regular file", path);
    }
    if ((unsigned long long)st.st_size > max_bytes) {
        fclose(f);
        return nd_error(ND_ELIMIT, "%s: file is %lld bytes, over the %zu-byte limit", path,
                        (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    unsigned char *p = malloc(n + 1);
    if (!p) {
        fclose(f);
        return nd_error(ND_ENOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = fread(p, 1, n, f);
    int err = ferror(f);
    fclose(f);
    if (got != n || err) {
        free(p);
        return nd_error(ND_EIO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    p[n] = 0;
    *buf = p;
    *len = n;
    return ND_OK;
}

int nd_atomic_open(nd_atomic_file *af, const char *path)
{
    memset(af, 0, sizeof *af);
    size_t n = strlen(path);
    af->path = malloc(n + 1);
    af->tmp_path = malloc(n + 16);
    if (!af->path || !af->tmp_path) {
        free(af->path);
        free(af->tmp_path);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    memcpy(af->path, path, n + 1);
    snprintf(af->tmp_path, n + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(af->tmp_path);
    if (fd < 0) {
        int e = errno;
        free(af->path);
        free(af->tmp_path);
        af->path = af->tmp_path = NULL;
        return nd_error(ND_EIO, "%s: cannot create output: %s", path, strerror(e));
    }
    fchmod(fd, 0644);
    af->fp = fdopen(fd, "wb");
    if (!af->fp) {
        close(fd);
        unlink(af->tmp_path);
        free(af->path);
        free(af->tmp_path);
        af->path = af->tmp_path = NULL;
        return nd_error(ND_EIO, "%s: fdopen failed", path);
    }
    return ND_OK;
}

void nd_atomic_abort(nd_atomic_file *af)
{
    if (af->fp)
        fclose(af->fp);
    if (af->tmp_path)
        unlink(af->tmp_path);
    free(af->tmp_path);
    free(af->path);
    memset(af, 0, sizeof *af);
}

int nd_atomic_commit(nd_atomic_file *af)
{
    FILE *f = af->fp;
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int e = errno;
    af->fp = NULL;
    if (fclose(f) != 0)
        bad = 1;
    if (bad || rename(af->tmp_path, af->path) != 0) {
        if (!bad)
            e = errno;
        int rc = nd_error(ND_EIO, "%s: write failed: %s", af->path, strerror(e));
        nd_atomic_abort(af);
        return rc;
    }
    free(af->tmp_path);
    free(af->path);
    memset(af, 0, sizeof *af);
    return ND_OK;
}

int nd_write_file_atomic(const char *path, const void *data, size_t len)
{
    nd_atomic_file af;
    int rc = nd_atomic_open(&af, path);
    if (rc)
        return rc;
    if (len && fwrite(data, 1, len, af.fp) != len) {
        nd_atomic_abort(&af);
        return nd_error(ND_EIO, "%s: write failed", path);
    }
    return nd_atomic_commit(&af);
}

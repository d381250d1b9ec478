#define _POSIX_C_SOURCE 200809L
#include "core/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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

/* ---- output paths ---- */

static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISFIFO(m))
        return "a FIFO (named pipe)";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISLNK(m))
        return "a symbolic link";
    return "not a regular file";
}

int nd_output_check(const char *path, int *exists, mode_t *mode)
{
    struct stat st;
    if (exists)
        *exists = 0;
    if (!path || !*path)
        return nd_error(ND_EARG, "empty output path");
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return ND_OK;
        return nd_error(ND_EIO, "%s: cannot use as output: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return nd_error(ND_EIO,
                        "%s: is %s; refusing to replace it (outputs are written to a temporary "
                        "file and renamed over a regular file only)%s",
                        path, file_kind(st.st_mode),
                        S_ISLNK(st.st_mode) ? "; name the link's target instead" : "");
    if (exists)
        *exists = 1;
    if (mode)
        *mode = st.st_mode;
    return ND_OK;
}

int nd_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0)
        return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* dir part ("." when none) and base name of path into malloc'd strings */
static int split_path(const char *path, char **dir, char **base)
{
    const char *slash = strrchr(path, '/');
    size_t dn = slash ? (size_t)(slash - path) : 0;
    *dir = malloc(dn + 2);
    *base = strdup(slash ? slash + 1 : path);
    if (!*dir || !*base) {
        free(*dir);
        free(*base);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    if (!slash)
        strcpy(*dir, ".");
    else if (dn == 0)
        strcpy(*dir, "/");
    else {
        memcpy(*dir, path, dn);
        (*dir)[dn] = 0;
    }
    return ND_OK;
}

/* Remove ".<base>.tmp.<pid>[.<n>]" files in dir left by processes that no
 * longer exist (a save killed before its rename). */
static void remove_stale_temps(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    size_t bl = strlen(base);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (n[0] != '.' || strncmp(n + 1, base, bl) || strncmp(n + 1 + bl, ".tmp.", 5))
            continue;
        const char *p = n + 1 + bl + 5;
        char *end;
        errno = 0;
        long pid = strtol(p, &end, 10);
        if (end == p || errno || pid <= 0 || (*end && *end != '.'))
            continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* ours or alive (or not ours to judge) */
        size_t need = strlen(dir) + strlen(n) + 2;
        char *full = malloc(need);
        if (full) {
            snprintf(full, need, "%s/%s", dir, n);
            unlink(full);
            free(full);
        }
    }
    closedir(d);
}

/* Create the temp file ".<base>.tmp.<pid>[.<n>]" beside path; new files get
 * 0666 & ~umask, a replaced file keeps its mode. */
static int open_temp(const char *path, int exists, mode_t old_mode, char **tmp_out, int *fd_out)
{
    char *dir, *base;
    int rc = split_path(path, &dir, &base);
    if (rc)
        return rc;
    remove_stale_temps(dir, base);
    size_t cap = strlen(dir) + strlen(base) + 64;
    char *tmp = malloc(cap);
    if (!tmp) {
        free(dir);
        free(base);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    int fd = -1, e = 0;
    for (int k = 0; k < 100; k++) {
        if (k)
            snprintf(tmp, cap, "%s/.%s.tmp.%ld.%d", dir, base, (long)getpid(), k);
        else
            snprintf(tmp, cap, "%s/.%s.tmp.%ld", dir, base, (long)getpid());
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        e = errno;
        if (fd >= 0 || e != EEXIST)
            break;
    }
    free(dir);
    free(base);
    if (fd < 0) {
        free(tmp);
        return nd_error(ND_EIO, "%s: cannot create output: %s", path, strerror(e));
    }
    if (exists) {
        /* keep the replaced file's permissions */
        if (fchmod(fd, old_mode & 07777) != 0) {
            e = errno;
            close(fd);
            unlink(tmp);
            free(tmp);
            return nd_error(ND_EIO, "%s: cannot set the output's mode: %s", path, strerror(e));
        }
    }
    *tmp_out = tmp;
    *fd_out = fd;
    return ND_OK;
}

int nd_check_writable(const char *path)
{
    int exists;
    mode_t mode = 0;
    int rc = nd_output_check(path, &exists, &mode);
    if (rc)
        return rc;
    char *tmp;
    int fd;
    if ((rc = open_temp(path, exists, mode, &tmp, &fd)))
        return rc;
    close(fd);
    unlink(tmp);
    free(tmp);
    return ND_OK;
}

int nd_atomic_open(nd_atomic_file *af, const char *path)
{
    memset(af, 0, sizeof *af);
    int exists;
    mode_t mode = 0;
    int rc = nd_output_check(path, &exists, &mode);
    if (rc)
        return rc;
    af->path = strdup(path);
    if (!af->path)
        return nd_error(ND_ENOMEM, "out of memory");
    int fd;
    if ((rc = open_temp(path, exists, mode, &af->tmp_path, &fd))) {
        free(af->path);
        af->path = NULL;
        return rc;
    }
    af->fp = fdopen(fd, "wb");
    if (!af->fp) {
        int e = errno;
        close(fd);
        unlink(af->tmp_path);
        free(af->path);
        free(af->tmp_path);
        af->path = af->tmp_path = NULL;
        return nd_error(ND_EIO, "%s: cannot open the output stream: %s", path, strerror(e));
    }
    return ND_OK;
}

int nd_atomic_write(nd_atomic_file *af, const void *data, size_t len)
{
    if (af->err)
        return nd_error(ND_EIO, "%s: write failed: %s", af->path, strerror(af->err));
    errno = 0;
    if (len && fwrite(data, 1, len, af->fp) != len) {
        af->err = errno ? errno : EIO;
        return nd_error(ND_EIO, "%s: write failed: %s", af->path, strerror(af->err));
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

static void fsync_dir_of(const char *path)
{
    char *dir, *base;
    if (split_path(path, &dir, &base))
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd); /* make the rename itself durable; not every fs supports it */
        close(fd);
    }
    free(dir);
    free(base);
}

int nd_atomic_commit(nd_atomic_file *af)
{
    FILE *f = af->fp;
    int e = af->err;
    errno = 0;
    if (!e && fflush(f) != 0)
        e = errno ? errno : EIO;
    if (!e && ferror(f))
        e = EIO;
    if (!e && fsync(fileno(f)) != 0)
        e = errno;
    af->fp = NULL;
    errno = 0;
    if (fclose(f) != 0 && !e)
        e = errno ? errno : EIO;
    if (!e) {
        /* the target may have become something else since the open */
        int rc = nd_output_check(af->path, NULL, NULL);
        if (rc) {
            nd_atomic_abort(af);
            return rc;
        }
        if (rename(af->tmp_path, af->path) != 0) {
            e = errno;
            int rc2 = nd_error(ND_EIO, "%s: cannot replace the output: %s", af->path, strerror(e));
            nd_atomic_abort(af);
            return rc2;
        }
    }
    if (e) {
        int rc = nd_error(ND_EIO, "%s: write failed: %s", af->path, strerror(e));
        nd_atomic_abort(af);
        return rc;
    }
    fsync_dir_of(af->path);
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
    if ((rc = nd_atomic_write(&af, data, len))) {
        nd_atomic_abort(&af);
        return rc;
    }
    return nd_atomic_commit(&af);
}

int nd_dir_creatable(const char *dir, const char *what)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (;;) {
        struct stat st;
        if (stat(p, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                return nd_error(ND_EIO, "%s: cannot create the %s: %s", dir, what,
                                strerror(ENOTDIR));
            if (strcmp(p, dir) && access(p, W_OK | X_OK) != 0)
                return nd_error(ND_EIO, "%s: cannot create the %s: %s", dir, what, strerror(errno));
            return ND_OK;
        }
        if (errno != ENOENT)
            return nd_error(ND_EIO, "%s: cannot create the %s: %s", dir, what, strerror(errno));
        /* up one level: "a/b" -> "a", "/a" -> "/", "a" -> "." */
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/')
            p[--n] = 0;
        char *slash = strrchr(p, '/');
        if (!slash)
            snprintf(p, sizeof p, ".");
        else if (slash == p)
            p[1] = 0;
        else
            *slash = 0;
    }
}

int nd_mkdirs(const char *dir, const char *what)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0)
            continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return nd_error(ND_EIO, "%s: cannot create the %s: %s", dir, what, strerror(errno));
        p[i] = c;
    }
    return ND_OK;
}

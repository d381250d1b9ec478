/* Atomic output files: only regular files are replaced (links, devices,
 * FIFOs and directories are refused and left alone), the replaced file's
 * mode is kept and new files honour the umask, write errors carry the
 * system's reason (disk full through /dev/full), temporaries of killed
 * saves are removed by the next save, and nd_same_file sees through links. */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/status.h"
#include "testutil.h"

static char dir[256];

static const char *P(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int file_equals(const char *path, const char *text)
{
    unsigned char *b;
    size_t n;
    if (nd_read_file(path, 0, &b, &n))
        return 0;
    int ok = n == strlen(text) && !memcmp(b, text, n);
    free(b);
    return ok;
}

static int count_temps(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '\\.tmp\\.' || true", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

static pid_t dead_pid(void)
{
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    waitpid(c, NULL, 0);
    return c;
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/needle-fileio-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }

    /* new files honour the umask */
    mode_t old_umask = umask(027);
    CHECK(nd_write_file_atomic(P("new.bin"), "hello", 5) == ND_OK);
    struct stat st;
    CHECK(stat(P("new.bin"), &st) == 0 && (st.st_mode & 0777) == 0640);
    umask(old_umask);
    CHECK(file_equals(P("new.bin"), "hello"));

    /* a replaced file keeps its mode */
    chmod(P("new.bin"), 0604);
    CHECK(nd_write_file_atomic(P("new.bin"), "again", 5) == ND_OK);
    CHECK(stat(P("new.bin"), &st) == 0 && (st.st_mode & 0777) == 0604);
    CHECK(file_equals(P("new.bin"), "again"));
    CHECK(count_temps() == 0);

    /* a symbolic link is refused; link and target stay as they were */
    CHECK(symlink(P("new.bin"), P("link")) == 0);
    int rc = nd_write_file_atomic(P("link"), "XX", 2);
    CHECK_MSG(rc == ND_EIO && strstr(nd_last_error(), "symbolic link"), "%s", nd_last_error());
    CHECK(lstat(P("link"), &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(file_equals(P("new.bin"), "again"));
    /* ... and seen through by nd_same_file */
    CHECK(nd_same_file(P("link"), P("new.bin")) == 1);
    CHECK(link(P("new.bin"), P("hard")) == 0);
    CHECK(nd_same_file(P("hard"), P("new.bin")) == 1);
    CHECK(nd_same_file(P("new.bin"), P("missing")) == 0);
    CHECK(nd_write_file_atomic(P("other"), "o", 1) == ND_OK);
    CHECK(nd_same_file(P("other"), P("new.bin")) == 0);

    /* a FIFO: refused without ever being opened (that would block) */
    CHECK(mkfifo(P("fifo"), 0644) == 0);
    rc = nd_write_file_atomic(P("fifo"), "XX", 2);
    CHECK_MSG(rc == ND_EIO && strstr(nd_last_error(), "FIFO"), "%s", nd_last_error());
    CHECK(lstat(P("fifo"), &st) == 0 && S_ISFIFO(st.st_mode));

    /* a character device: as root our own node (1, 3), so that a
     * regression cannot replace the system's /dev/null */
    const char *dev = "/dev/null";
    if (geteuid() == 0 && mknod(P("null"), S_IFCHR | 0666, makedev(1, 3)) == 0)
        dev = P("null");
    rc = nd_write_file_atomic(dev, "XX", 2);
    CHECK_MSG(rc == ND_EIO && strstr(nd_last_error(), "character device"), "%s", nd_last_error());
    CHECK(lstat(dev, &st) == 0 && S_ISCHR(st.st_mode));

    /* a directory */
    CHECK(mkdir(P("adir"), 0755) == 0);
    rc = nd_write_file_atomic(P("adir"), "XX", 2);
    CHECK_MSG(rc == ND_EIO && strstr(nd_last_error(), "directory"), "%s", nd_last_error());

    /* writability is known before any work: missing directory */
    rc = nd_check_writable(P("no/such/dir/out.pkl"));
    CHECK_MSG(rc == ND_EIO && strstr(nd_last_error(), "No such file or directory"), "%s",
              nd_last_error());
    CHECK(nd_check_writable(P("fresh.pkl")) == ND_OK);
    CHECK(access(P("fresh.pkl"), F_OK) != 0);
    CHECK(count_temps() == 0);

    /* disk full: the temp file's descriptor is pointed at /dev/full; the
     * error says why, the old output stays, no temp file is left */
    nd_atomic_file af;
    CHECK(nd_atomic_open(&af, P("new.bin")) == ND_OK);
    int full = open("/dev/full", O_WRONLY);
    CHECK(full >= 0);
    if (full >= 0 && af.fp) {
        dup2(full, fileno((FILE *)af.fp));
        close(full);
        static char big[1 << 16];
        memset(big, 'x', sizeof big);
        rc = nd_atomic_write(&af, big, sizeof big);
        if (rc == ND_OK)
            rc = nd_atomic_commit(&af);
        else
            nd_atomic_abort(&af);
        CHECK_MSG(rc == ND_EIO && strstr(nd_last_error(), "No space left on device") &&
                      strstr(nd_last_error(), "new.bin"),
                  "%s", nd_last_error());
    }
    CHECK(file_equals(P("new.bin"), "again"));
    CHECK(count_temps() == 0);

    /* a small write that only fails at the flush in commit */
    CHECK(nd_atomic_open(&af, P("new.bin")) == ND_OK);
    full = open("/dev/full", O_WRONLY);
    if (full >= 0 && af.fp) {
        dup2(full, fileno((FILE *)af.fp));
        close(full);
        CHECK(nd_atomic_write(&af, "tiny", 4) == ND_OK);
        rc = nd_atomic_commit(&af);
        CHECK_MSG(rc == ND_EIO && strstr(nd_last_error(), "No space left on device"), "%s",
                  nd_last_error());
    }
    CHECK(file_equals(P("new.bin"), "again"));
    CHECK(count_temps() == 0);

    /* stale temporaries (their process is gone) are removed by the next
     * save of the same output; a live process's and other outputs' stay */
    char stale[512], live[512], other[512];
    snprintf(stale, sizeof stale, "%s/.new.bin.tmp.%ld", dir, (long)dead_pid());
    snprintf(live, sizeof live, "%s/.new.bin.tmp.%ld", dir, (long)getppid());
    snprintf(other, sizeof other, "%s/.other.tmp.%ld", dir, (long)dead_pid());
    FILE *f;
    if ((f = fopen(stale, "w")))
        fclose(f);
    if ((f = fopen(live, "w")))
        fclose(f);
    if ((f = fopen(other, "w")))
        fclose(f);
    CHECK(nd_write_file_atomic(P("new.bin"), "third", 5) == ND_OK);
    CHECK(access(stale, F_OK) != 0);
    CHECK(access(live, F_OK) == 0);
    CHECK(access(other, F_OK) == 0);
    CHECK(file_equals(P("new.bin"), "third"));
    unlink(live);
    unlink(other);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return tu_finish("test_fileio");
}

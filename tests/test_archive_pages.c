/* Which pages of a mapped archive a session keeps (issue 36's 4-bit
 * session memory): the pages loading touched (small tensors, the
 * tokenizer blob) are handed back once the model is loaded, and the
 * engram n-gram tables are read a row at a time with pread (a mapped read
 * maps the 64 KB around each row, and a turn's scattered lookups made the
 * whole table resident). Checked page by page through /proc/self/pagemap;
 * the rows read from the file equal the mapping's bit for bit. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_internal.h"
#include "engine/qmat.h"
#include "model/san.h"
#include "needle.h"
#include "testutil.h"

static const char *TOOLS = "[{\"name\": \"set_timer\", \"description\": \"start a timer\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"minutes\": "
                           "{\"type\": \"integer\"}}, \"required\": [\"minutes\"]}}]";

/* this process's mapped pages in [a, b) (page-aligned inward); -1 when
 * /proc/self/pagemap cannot be read (then the page checks are skipped) */
/* open file descriptors of this process (-1: /proc/self/fd unreadable) */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* less the directory's own */
}

static long present_pages(const void *a, const void *b)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)a + (uintptr_t)pg - 1) / (uintptr_t)pg,
              hi = (uintptr_t)b / (uintptr_t)pg;
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0)
        return -1;
    long n = 0;
    for (uintptr_t p = lo; p < hi; p++) {
        uint64_t e;
        if (pread(fd, &e, sizeof e, (off_t)(p * sizeof e)) != (ssize_t)sizeof e) {
            n = -1;
            break;
        }
        n += (long)(e >> 63);
    }
    close(fd);
    return n;
}

int main(void)
{
    nd_tokenizer *tok = NULL;
    if (nd_tokenizer_load("models/tokenizer.model", &tok)) {
        fprintf(stderr, "test_archive_pages: %s\n", nd_last_error());
        return 1;
    }
    san_config c;
    san_config_preset(&c, "tiny");
    c.engram_slots = 8192; /* 2 tables x 8192 rows x 66 B: 1.1 MB, 17 x 64 KB */
    c.max_seq_len = 512;
    san_model src;
    CHECK(san_model_create(&src, &c) == 0);
    san_model_init_random(&src, 7);
    size_t len;
    unsigned char *arch = tu_archive(&src, tok, 4, 256, &len);
    /* Reading a neighbouring tensor maps the 64 KB around it, and a whole
     * page cache folio (up to 2 MB) where the file has large ones: the
     * archive goes to tmpfs (single pages) or, without one, leaves the
     * page cache after the load (below), so nothing but the tables' own
     * reads could map their pages past 64 KB from either end. */
    char dir[] = "/dev/shm/needle_pagesXXXXXX", path[64];
    int shm = mkdtemp(dir) != NULL;
    if (!shm) {
        memcpy(dir, "/tmp/needle_pages_XXXXXX", sizeof "/tmp/needle_pages_XXXXXX");
        CHECK(mkdtemp(dir) != NULL);
    }
    snprintf(path, sizeof path, "%s/m.cact", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(arch, 1, len, f) == len);
    if (f)
        fclose(f);
    unsetenv("NEEDLE_FLOAT");
    int fds = open_fds();
    needle_model *M = needle_model_load(path);
    CHECK_MSG(open_fds() == fds + 1, "%d descriptors open with the model, %d before", open_fds(),
              fds); /* the archive's, for the tables' reads */
    CHECK_MSG(M, "%s", needle_thread_error());
    if (!M)
        return tu_finish("test_archive_pages");
    const nd_qmat *tab = &M->qw.eng[0].table;
    CHECK_MSG(M->quant && M->arch.map && tab->file_rows, "quant %d map %p file_rows %d", M->quant,
              M->arch.map, tab->file_rows);
    const uint8_t *c0 = tab->codes, *c1 = c0 + (size_t)tab->rows * tab->row_bytes;
    /* loading touched every small tensor and the tokenizer: all handed back */
    long loaded = present_pages(M->arch.data, M->arch.data + len);
    CHECK_MSG(loaded <= 0, "%ld pages of the archive mapped after the load", loaded);
    if (!shm) { /* single pages read from disk from here on */
        int fd = open(path, O_RDONLY);
        CHECK(fd >= 0 && !fsync(fd) && !posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
        if (fd >= 0)
            close(fd);
        CHECK(!madvise(M->arch.map, len, MADV_RANDOM));
    }

    needle_session *S = needle_session_new(M, "You are a home assistant.", TOOLS);
    CHECK_MSG(S, "%s", needle_thread_error());
    char buf[8192];
    for (int t = 0; S && t < 2; t++) {
        int rc =
            needle_session_complete(S, "set a timer for five minutes please", 24, buf, sizeof buf);
        CHECK_MSG(rc >= 0, "turn %d: rc %d %s", t, rc, needle_session_error(S));
    }
    const long edge = 64 * 1024;
    long tables = present_pages(c0 + edge, c1 - edge);
    long whole = present_pages(M->arch.data, M->arch.data + len);
    if (tables < 0 || loaded < 0) {
        fprintf(stderr, "test_archive_pages: /proc/self/pagemap unreadable: page checks skipped\n");
    } else {
        CHECK_MSG(tables == 0, "%ld pages inside the engram tables' codes mapped after two turns",
                  tables);
        CHECK_MSG(whole > 0, "no page of the archive mapped after two turns (%ld)", whole);
    }
    /* the rows read from the file are the mapping's, bit for bit */
    nd_qmat mapped = *tab;
    mapped.file_rows = 0;
    int sub = tab->in;
    float *a = malloc((size_t)sub * sizeof *a), *b = malloc((size_t)sub * sizeof *b);
    CHECK(a && b);
    for (int r = 0; a && b && r < tab->rows; r += 997) {
        nd_qmat_row(tab, r, a);
        nd_qmat_row(&mapped, r, b);
        CHECK_MSG(!memcmp(a, b, (size_t)sub * sizeof *a), "row %d differs read from the file", r);
    }
    /* a descriptor that cannot be read falls back to the mapping */
    nd_qmat bad = *tab;
    bad.file_fd = -1;
    nd_qmat_row(&bad, 5, a);
    nd_qmat_row(&mapped, 5, b);
    CHECK(a && b && !memcmp(a, b, (size_t)sub * sizeof *a));
    free(a);
    free(b);
    needle_session_free(S);
    needle_model_free(M);
    CHECK_MSG(open_fds() == fds, "%d descriptors open after needle_model_free, %d before",
              open_fds(), fds);
    unlink(path);
    rmdir(dir);
    free(arch);
    san_model_free(&src);
    nd_tokenizer_free(tok);
    return tu_finish("test_archive_pages");
}

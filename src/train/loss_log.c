#define _POSIX_C_SOURCE 200809L
#include "train/loss_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"

/* The "step" of a log line, or -1 when it has none. */
static long line_step(const char *line)
{
    const char *p = strstr(line, "\"step\":");
    if (!p)
        return -1;
    char *end;
    long v = strtol(p + 7, &end, 10);
    return end == p + 7 ? -1 : v;
}

int nd_loss_log_open(nd_loss_log *l, const char *path, long resume_step)
{
    l->f = NULL;
    l->path = path;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp)
        return nd_error(ND_ENOMEM, "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *out = fopen(tmp, "w");
    if (!out) {
        int e = errno;
        free(tmp);
        return nd_error(ND_EIO, "%s: cannot write the loss log: %s", path, strerror(e));
    }
    FILE *in = resume_step > 0 ? fopen(path, "r") : NULL;
    if (in) {
        char *line = NULL;
        size_t cap = 0;
        while (getline(&line, &cap, in) > 0) {
            long s = line_step(line);
            size_t n = strlen(line);
            if (s < 0 || s > resume_step || line[n - 1] != '\n')
                continue; /* after the resumed step, or cut short by a kill */
            fputs(line, out);
        }
        free(line);
        fclose(in);
    }
    int bad = fflush(out) != 0 || ferror(out);
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        fclose(out);
        remove(tmp);
        free(tmp);
        return nd_error(ND_EIO, "%s: cannot write the loss log: %s", path, strerror(e));
    }
    free(tmp);
    l->f = out; /* the renamed file, positioned at its end */
    return ND_OK;
}

static int log_done(nd_loss_log *l)
{
    if (fflush(l->f) != 0 || ferror(l->f))
        return nd_error(ND_EIO, "%s: writing the loss log failed: %s", l->path, strerror(errno));
    return ND_OK;
}

int nd_loss_log_step(nd_loss_log *l, long step, int epoch, double lr, double loss)
{
    if (!l->f)
        return ND_OK;
    fprintf(l->f, "{\"step\": %ld, \"epoch\": %d, \"lr\": %.9g, \"loss\": %.9g}\n", step, epoch, lr,
            loss);
    return log_done(l);
}

int nd_loss_log_val(nd_loss_log *l, long step, int epoch, double val_loss)
{
    if (!l->f)
        return ND_OK;
    fprintf(l->f, "{\"step\": %ld, \"epoch\": %d, \"val_loss\": %.9g}\n", step, epoch, val_loss);
    return log_done(l);
}

int nd_loss_log_close(nd_loss_log *l)
{
    if (!l->f)
        return ND_OK;
    int rc =
        fclose(l->f) != 0 ? nd_error(ND_EIO, "%s: closing the loss log failed", l->path) : ND_OK;
    l->f = NULL;
    return rc;
}

#define _POSIX_C_SOURCE 200809L /* setenv */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/fileio.h"
#include "backend/backend.h"
#include "core/status.h"
#include "core/tuning.h"

int cli_fail(const char *context)
{
    if (context)
        fprintf(stderr, "needle: %s: %s\n", context, nd_last_error());
    else
        fprintf(stderr, "needle: %s\n", nd_last_error());
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "needle %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see `needle %s --help`)\n", cmd);
    return 2;
}

int cli_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "needle: %s expects an integer in [%lld, %lld], got '%s'\n", flag, lo, hi,
                s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *flag, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v)) {
        fprintf(stderr, "needle: %s expects a finite number, got '%s'\n", flag, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

int cli_check_output(const char *out, ...)
{
    if (!out)
        return 0;
    va_list ap;
    va_start(ap, out);
    int bad = 0;
    for (;;) {
        const char *what = va_arg(ap, const char *);
        if (!what)
            break;
        const char *in = va_arg(ap, const char *);
        if (!bad && in && nd_same_file(out, in)) {
            fprintf(stderr,
                    "needle: %s: is the same file as the %s (%s); refusing to overwrite an "
                    "input, choose another output path\n",
                    out, what, in);
            bad = 1;
        }
    }
    va_end(ap);
    if (bad)
        return 1;
    if (nd_output_check(out, NULL, NULL))
        return cli_fail(NULL);
    return 0;
}

const nd_backend *cli_backend(const char *cmd, const char *device, const char *precision,
                              int threads)
{
    if (precision && strcmp(precision, "fp32") && strcmp(precision, "tf32") &&
        strcmp(precision, "bf16")) {
        cli_usage_error(cmd, "--precision: expected fp32, tf32 or bf16, got '%s'", precision);
        return NULL;
    }
    /* the CUDA plugin's GEMM precision: the tuning struct's switch, which
     * the registry hands to the plugin when it opens its device */
    if (precision) {
        nd_tuning t = *nd_tuning_get();
        snprintf(t.cuda_precision, sizeof t.cuda_precision, "%s", precision);
        if (nd_tuning_use(&t)) {
            cli_fail(NULL);
            return NULL;
        }
    }
    const nd_backend *be = nd_backend_get(device, threads);
    if (!be) {
        cli_fail(NULL);
        return NULL;
    }
    if (precision && strcmp(precision, "fp32") && strcmp(be->name, "cuda")) {
        fprintf(stderr,
                "needle %s: --precision %s applies to the CUDA backend's GEMMs; the backend here "
                "is %s (float32 only)\n",
                cmd, precision, be->name);
        return NULL;
    }
    return be;
}

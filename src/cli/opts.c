/* Declarative command-line options (opts.h): parsing and --help. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"

void (*cli_opts_describe)(const cli_cmd *c);

/* "needle run: ..." for every form of a command ("run --checkpoint" too) */
static int opt_error(const cli_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int opt_error(const cli_cmd *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "%.*s", (int)strcspn(c->name, " "), c->name);
    return cli_usage_error(cmd, "%s", msg);
}

cli_opt *cli_opts_find(const cli_cmd *c, const char *name)
{
    for (size_t i = 0; i < c->n_opts; i++)
        if (!strcmp(c->opts[i].name, name))
            return &c->opts[i];
    return NULL;
}

int cli_opts_given(const cli_cmd *c, const char *name)
{
    const cli_opt *o = cli_opts_find(c, name);
    return o && o->given;
}

/* "a number > 0", "a number in [0, 1)", "a finite number" */
static void float_range(const cli_opt *o, char *buf, size_t n)
{
    int has_lo = !(o->flags & CLI_NO_LO), has_hi = !(o->flags & CLI_NO_HI);
    int lo_open = o->flags & CLI_LO_OPEN, hi_open = o->flags & CLI_HI_OPEN;
    if (has_lo && has_hi)
        snprintf(buf, n, "a number in %c%g, %g%c", lo_open ? '(' : '[', o->lo, o->hi,
                 hi_open ? ')' : ']');
    else if (has_lo)
        snprintf(buf, n, "a number %s %g", lo_open ? ">" : ">=", o->lo);
    else if (has_hi)
        snprintf(buf, n, "a number %s %g", hi_open ? "<" : "<=", o->hi);
    else
        snprintf(buf, n, "a finite number");
}

/* ENUM choices "a|b|c" as "a, b or c" */
static void choice_list(const char *choices, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (const char *p = choices; *p && len + 1 < n;) {
        size_t w = strcspn(p, "|");
        const char *sep = "";
        if (p != choices)
            sep = p[w] ? ", " : " or ";
        len += (size_t)snprintf(buf + len, n - len, "%s%.*s", sep, (int)w, p);
        if (len >= n)
            break;
        p += w + (p[w] == '|');
    }
}

static int enum_ok(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        size_t w = strcspn(p, "|");
        if (w == n && !strncmp(p, v, n))
            return 1;
        p += w + (p[w] == '|');
    }
    return 0;
}

static int set_value(const cli_cmd *c, cli_opt *o, const char *v)
{
    char *end;
    errno = 0;
    switch (o->kind) {
    case CLI_INT:
    case CLI_I64: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno || (double)x < o->lo || (double)x > o->hi)
            return opt_error(c, "%s expects an integer in [%.0f, %.0f], got '%s'", o->name, o->lo,
                             o->hi, v);
        if (o->kind == CLI_INT)
            *(int *)o->target = (int)x;
        else
            *(long long *)o->target = x;
        return 0;
    }
    case CLI_FLOAT: {
        double x = strtod(v, &end);
        int bad = !*v || *end || errno || !isfinite(x);
        if (!bad && !(o->flags & CLI_NO_LO))
            bad = (o->flags & CLI_LO_OPEN) ? !(x > o->lo) : !(x >= o->lo);
        if (!bad && !(o->flags & CLI_NO_HI))
            bad = (o->flags & CLI_HI_OPEN) ? !(x < o->hi) : !(x <= o->hi);
        if (bad) {
            char range[96];
            float_range(o, range, sizeof range);
            return opt_error(c, "%s expects %s, got '%s'", o->name, range, v);
        }
        *(double *)o->target = x;
        return 0;
    }
    case CLI_ENUM:
        if (!enum_ok(o->choices, v)) {
            char list[256];
            choice_list(o->choices, list, sizeof list);
            return opt_error(c, "%s must be %s, got '%s'", o->name, list, v);
        }
        *(const char **)o->target = v;
        return 0;
    case CLI_STR:
    case CLI_PATH:
    case CLI_DIR: *(const char **)o->target = v; return 0;
    case CLI_LIST: {
        cli_strlist *l = o->target;
        if (l->n == CLI_LIST_MAX)
            return opt_error(c, "at most %d %s values", CLI_LIST_MAX, o->name);
        l->v[l->n++] = v;
        return 0;
    }
    case CLI_FLAG: break;
    }
    return opt_error(c, "%s: internal error: unknown option kind", o->name);
}

int cli_opts_parse(cli_cmd *c, int argc, char **argv)
{
    c->n_pos = 0;
    for (size_t k = 0; k < c->n_opts; k++)
        c->opts[k].given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (cli_opts_describe)
                cli_opts_describe(c);
            else
                cli_opts_help(c, stdout);
            return -1;
        }
        if (a[0] != '-' || a[1] != '-') {
            if (c->n_pos >= c->max_pos || c->n_pos >= CLI_MAX_POS)
                return opt_error(c, "unexpected argument '%s'", a);
            c->pos[c->n_pos++] = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        cli_opt *o = NULL;
        for (size_t k = 0; k < c->n_opts && !o; k++)
            if (strlen(c->opts[k].name) == len && !strncmp(c->opts[k].name, a, len))
                o = &c->opts[k];
        if (!o)
            return opt_error(c, "unknown option '%.*s'", (int)len, a);
        o->given++;
        if (o->kind == CLI_FLAG) {
            if (eq)
                return opt_error(c, "%s takes no value, got '%s'", o->name, eq + 1);
            *(int *)o->target = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v)
            return opt_error(c, "%s needs a value", o->name);
        if (set_value(c, o, v))
            return 2;
    }
    return 0;
}

/* `text` wrapped to `width` columns, continuation lines indented by
 * `indent`; an explicit '\n' breaks the line there. */
static void put_wrapped(FILE *f, const char *text, int col, int indent, int width)
{
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            p++;
            continue;
        }
        if (*p == ' ') {
            p++;
            continue;
        }
        size_t w = strcspn(p, " \n");
        if (col > indent && col + 1 + (int)w > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)w, p);
        col += (int)w;
        p += w;
    }
    fputc('\n', f);
}

void cli_opts_help(const cli_cmd *c, FILE *f)
{
    fputs(c->usage, f);
    if (c->about && *c->about) {
        fputc('\n', f);
        fputs(c->about, f);
    }
    if (c->n_opts)
        fputc('\n', f);
    /* the help column: after the longest "--name ARG" up to 20 characters */
    int w = 0;
    for (size_t i = 0; i < c->n_opts; i++) {
        const cli_opt *o = &c->opts[i];
        int n = (int)strlen(o->name) + (o->kind == CLI_FLAG ? 0 : 1 + (int)strlen(o->arg));
        if (n <= 20 && n > w)
            w = n;
    }
    int indent = 2 + w + 2;
    for (size_t i = 0; i < c->n_opts; i++) {
        const cli_opt *o = &c->opts[i];
        int n;
        if (o->kind == CLI_FLAG)
            n = fprintf(f, "  %s", o->name);
        else
            n = fprintf(f, "  %s %s", o->name, o->arg);
        if (n + 2 > indent) {
            fprintf(f, "\n%*s", indent, "");
        } else {
            fprintf(f, "%*s", indent - n, "");
        }
        put_wrapped(f, o->help, indent, indent, 79);
    }
    if (c->epilog) {
        fputc('\n', f);
        fputs(c->epilog, f);
    }
}

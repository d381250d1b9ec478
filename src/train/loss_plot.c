#include "train/loss_plot.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/status.h"

/* The number after "key": in a line of our own log format, or NAN. */
static double field(const char *line, const char *key, int *found)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    *found = 0;
    if (!p)
        return NAN;
    char *end;
    double v = strtod(p + strlen(pat), &end);
    if (end == p + strlen(pat))
        return NAN;
    *found = 1;
    return v;
}

static int grow(void **p, size_t elem, long n, long *cap)
{
    if (n < *cap)
        return 0;
    long nc = *cap ? *cap * 2 : 256;
    void *q = realloc(*p, elem * (size_t)nc);
    if (!q)
        return 1;
    *p = q;
    *cap = nc;
    return 0;
}

int nd_loss_curve_load(const char *path, nd_loss_curve *c)
{
    memset(c, 0, sizeof *c);
    unsigned char *buf;
    size_t len;
    int rc = nd_read_file(path, 0, &buf, &len);
    if (rc)
        return rc;
    long cap = 0, vcap = 0, lineno = 0;
    char *save = (char *)buf;
    while (save && *save) {
        char *line = save, *nl = strchr(line, '\n');
        save = nl ? nl + 1 : NULL;
        if (nl)
            *nl = 0;
        lineno++;
        if (!line[strspn(line, " \t\r")])
            continue;
        int fs, fl, fv, fe, fr;
        double step = field(line, "step", &fs), loss = field(line, "loss", &fl);
        double val = field(line, "val_loss", &fv), epoch = field(line, "epoch", &fe);
        double lr = field(line, "lr", &fr);
        if (!fs || !(step >= 0) || (!fl && !fv) || (fl && !isfinite(loss)) ||
            (fv && !isfinite(val))) {
            rc = nd_error(ND_EFORMAT,
                          "%s:%ld: not a loss-log line (expected {\"step\": N, ..., \"loss\": X} "
                          "or {\"step\": N, ..., \"val_loss\": X} with finite numbers)",
                          path, lineno);
            break;
        }
        if (fv) {
            if (grow((void **)&c->val_step, sizeof *c->val_step, c->n_val, &vcap) ||
                !(c->val_loss = realloc(c->val_loss, sizeof *c->val_loss * (size_t)vcap))) {
                rc = nd_error(ND_ENOMEM, "out of memory");
                break;
            }
            c->val_step[c->n_val] = (long)step;
            c->val_loss[c->n_val++] = val;
            continue;
        }
        if (c->n && (long)step <= c->step[c->n - 1]) {
            rc = nd_error(ND_EFORMAT, "%s:%ld: step %ld after step %ld (steps must increase)", path,
                          lineno, (long)step, c->step[c->n - 1]);
            break;
        }
        long oc = cap;
        if (grow((void **)&c->step, sizeof *c->step, c->n, &cap) ||
            (cap != oc && (!(c->loss = realloc(c->loss, sizeof *c->loss * (size_t)cap)) ||
                           !(c->lr = realloc(c->lr, sizeof *c->lr * (size_t)cap)) ||
                           !(c->epoch = realloc(c->epoch, sizeof *c->epoch * (size_t)cap))))) {
            rc = nd_error(ND_ENOMEM, "out of memory");
            break;
        }
        c->step[c->n] = (long)step;
        c->loss[c->n] = loss;
        c->lr[c->n] = fr ? lr : NAN;
        c->epoch[c->n++] = fe ? (int)epoch : 0;
    }
    free(buf);
    if (!rc && c->n == 0)
        rc = nd_error(ND_EFORMAT, "%s: no train-loss lines (is it a --loss-log file?)", path);
    if (rc)
        nd_loss_curve_free(c);
    return rc;
}

void nd_loss_curve_free(nd_loss_curve *c)
{
    free(c->step);
    free(c->lr);
    free(c->loss);
    free(c->epoch);
    free(c->val_step);
    free(c->val_loss);
    memset(c, 0, sizeof *c);
}

/* Tick spacing of 1, 2 or 5 times a power of ten giving about `want`
 * intervals over span. */
static double nice_step(double span, int want)
{
    double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} strbuf;

static void put(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(strbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0 || b->oom)
            return;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *q = realloc(b->s, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->s = q;
        b->cap = nc;
    }
}

/* XML text: & < > escaped. */
static void put_text(strbuf *b, const char *t)
{
    for (; *t; t++) {
        if (*t == '&')
            put(b, "&amp;");
        else if (*t == '<')
            put(b, "&lt;");
        else if (*t == '>')
            put(b, "&gt;");
        else
            put(b, "%c", *t);
    }
}

int nd_loss_plot_svg(const nd_loss_curve *c, const char *title, double smooth, const char *out)
{
    if (!(smooth >= 0 && smooth < 1))
        return nd_error(ND_EARG, "smoothing must be in [0, 1), got %g", smooth);
    const double W = 800, H = 480, L = 70, R = 20, T = 40, B = 55;
    double x0 = (double)c->step[0], x1 = (double)c->step[c->n - 1];
    double y0 = c->loss[0], y1 = c->loss[0];
    for (long i = 0; i < c->n; i++) {
        y0 = fmin(y0, c->loss[i]);
        y1 = fmax(y1, c->loss[i]);
    }
    for (long i = 0; i < c->n_val; i++) {
        y0 = fmin(y0, c->val_loss[i]);
        y1 = fmax(y1, c->val_loss[i]);
        x0 = fmin(x0, (double)c->val_step[i]);
        x1 = fmax(x1, (double)c->val_step[i]);
    }
    if (x1 <= x0)
        x1 = x0 + 1;
    if (y1 <= y0)
        y1 = y0 + 1;
    double pad = (y1 - y0) * 0.05;
    y0 = fmax(0, y0 - pad);
    y1 += pad;
    double pw = W - L - R, ph = H - T - B;
#define PX(x) (L + ((x)-x0) / (x1 - x0) * pw)
#define PY(y) (T + ph - ((y)-y0) / (y1 - y0) * ph)
    strbuf b = {0};
    put(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    put(&b,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
        "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
        W, H, W, H);
    put(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<title>");
    put_text(&b, title);
    put(&b,
        "</title>\n<text id=\"title\" x=\"%.1f\" y=\"24\" text-anchor=\"middle\" "
        "font-size=\"16\">",
        W / 2);
    put_text(&b, title);
    put(&b, "</text>\n");
    /* ticks and grid */
    put(&b, "<g id=\"x-ticks\" stroke=\"#ddd\">\n");
    double xs = nice_step(x1 - x0, 8), ys = nice_step(y1 - y0, 6);
    for (double x = ceil(x0 / xs) * xs; x <= x1 + xs * 1e-9; x += xs)
        put(&b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/><text x=\"%.1f\" y=\"%.1f\" "
            "stroke=\"none\" fill=\"black\" text-anchor=\"middle\">%g</text>\n",
            PX(x), T, PX(x), T + ph, PX(x), T + ph + 16, x);
    put(&b, "</g>\n<g id=\"y-ticks\" stroke=\"#ddd\">\n");
    for (double y = ceil(y0 / ys) * ys; y <= y1 + ys * 1e-9; y += ys)
        put(&b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/><text x=\"%.1f\" y=\"%.1f\" "
            "stroke=\"none\" fill=\"black\" text-anchor=\"end\">%g</text>\n",
            L, PY(y), L + pw, PY(y), L - 6, PY(y) + 4, y);
    put(&b, "</g>\n");
    put(&b,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
        "stroke=\"black\"/>\n",
        L, T, pw, ph);
    put(&b,
        "<text id=\"x-label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n"
        "<text id=\"y-label\" transform=\"translate(18 %.1f) rotate(-90)\" "
        "text-anchor=\"middle\">loss (cross-entropy, nats per target token)</text>\n",
        L + pw / 2, H - 12, T + ph / 2);
    /* every logged step: no downsampling (a 2-hour run logs a few
     * thousand steps, a few tens of kB) */
    put(&b, "<polyline id=\"train-loss\" fill=\"none\" stroke=\"#9ecae1\" stroke-width=\"1\" "
            "points=\"");
    for (long i = 0; i < c->n; i++)
        put(&b, "%s%.2f,%.2f", i ? " " : "", PX((double)c->step[i]), PY(c->loss[i]));
    put(&b, "\"/>\n<polyline id=\"train-loss-smoothed\" fill=\"none\" stroke=\"#08519c\" "
            "stroke-width=\"2\" points=\"");
    double ema = 0, wsum = 0;
    for (long i = 0; i < c->n; i++) {
        ema = smooth * ema + (1 - smooth) * c->loss[i];
        wsum = smooth * wsum + (1 - smooth);
        put(&b, "%s%.2f,%.2f", i ? " " : "", PX((double)c->step[i]), PY(ema / wsum));
    }
    put(&b, "\"/>\n<g id=\"val-loss\" fill=\"#e6550d\">\n");
    for (long i = 0; i < c->n_val; i++)
        put(&b,
            "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"4\"><title>step %ld val %.4f</title></circle>\n",
            PX((double)c->val_step[i]), PY(c->val_loss[i]), c->val_step[i], c->val_loss[i]);
    put(&b, "</g>\n");
    /* legend */
    double lx = L + pw - 190, ly = T + 12;
    put(&b,
        "<g id=\"legend\"><rect x=\"%.1f\" y=\"%.1f\" width=\"180\" height=\"%d\" "
        "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n<line x1=\"%.1f\" y1=\"%.1f\" "
        "x2=\"%.1f\" y2=\"%.1f\" "
        "stroke=\"#9ecae1\"/>"
        "<text x=\"%.1f\" y=\"%.1f\">train loss</text>\n"
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#08519c\" "
        "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">smoothed (EMA %g)</text>\n",
        lx - 8, ly - 10, c->n_val ? 52 : 36, lx, ly, lx + 24, ly, lx + 30, ly + 4, lx, ly + 16,
        lx + 24, ly + 16, lx + 30, ly + 20, smooth);
    if (c->n_val)
        put(&b,
            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#e6550d\"/><text x=\"%.1f\" "
            "y=\"%.1f\">validation loss</text>\n",
            lx + 12, ly + 32, lx + 30, ly + 36);
    put(&b, "</g>\n</svg>\n");
#undef PX
#undef PY
    if (b.oom) {
        free(b.s);
        return nd_error(ND_ENOMEM, "out of memory drawing %s", out);
    }
    int rc = nd_write_file_atomic(out, b.s, b.n);
    free(b.s);
    return rc;
}

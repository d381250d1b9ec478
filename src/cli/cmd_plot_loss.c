/* needle plot-loss: a --loss-log file as an SVG loss curve. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/status.h"
#include "train/loss_plot.h"

static const char *plot_loss_help =
    "usage: needle plot-loss LOSS.jsonl --out CURVE.svg [options]\n"
    "\n"
    "Draw the loss curve of a `needle finetune --loss-log` file as an SVG picture:\n"
    "the train loss of every logged step (thin line, no downsampling), its\n"
    "exponential moving average (thick line), validation losses (dots), axes with\n"
    "ticks and labels, and a title.\n"
    "\n"
    "  --out PATH      the SVG to write (required; written atomically)\n"
    "  --title TEXT    title (default: \"Training loss\" and the log's name)\n"
    "  --smooth X      EMA weight of the past in [0, 1) (default 0.9; 0 = none)\n";

int cli_plot_loss(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *title = NULL;
    double smooth = 0.9;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(plot_loss_help, stdout);
            return 0;
        }
        if (a[0] != '-' || a[1] != '-') {
            if (in)
                return cli_usage_error("plot-loss", "unexpected argument '%s'", a);
            in = a;
            continue;
        }
        if (i + 1 >= argc)
            return cli_usage_error("plot-loss", "%s needs a value", a);
        const char *val = argv[++i];
        if (!strcmp(a, "--out"))
            out = val;
        else if (!strcmp(a, "--title"))
            title = val;
        else if (!strcmp(a, "--smooth")) {
            if (cli_parse_double(a, val, &smooth) || !(smooth >= 0 && smooth < 1))
                return cli_usage_error("plot-loss", "--smooth must be in [0, 1)");
        } else
            return cli_usage_error("plot-loss", "unknown option '%s'", a);
    }
    if (!in)
        return cli_usage_error("plot-loss", "missing LOSS.jsonl");
    if (!out)
        return cli_usage_error("plot-loss", "missing --out CURVE.svg");
    if (cli_check_output(out, "loss log", in, (const char *)NULL))
        return 1;
    char tbuf[1024];
    if (!title) {
        const char *base = strrchr(in, '/');
        snprintf(tbuf, sizeof tbuf, "Training loss (%s)", base ? base + 1 : in);
        title = tbuf;
    }
    nd_loss_curve c;
    if (nd_loss_curve_load(in, &c))
        return cli_fail(NULL);
    int rc = nd_loss_plot_svg(&c, title, smooth, out);
    if (!rc)
        printf("%s: %ld steps (%ld to %ld), %ld validation points\n", out, c.n, c.step[0],
               c.step[c.n - 1], c.n_val);
    nd_loss_curve_free(&c);
    return rc ? cli_fail(NULL) : 0;
}

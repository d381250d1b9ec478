/* needle plot-loss: a --loss-log file as an SVG loss curve. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "train/loss_plot.h"

static const char *plot_loss_usage =
    "usage: needle plot-loss LOSS.jsonl --out CURVE.svg [options]\n";
static const char *plot_loss_about =
    "Draw the loss curve of a `needle finetune --loss-log` file as an SVG picture:\n"
    "the train loss of every logged step (thin line, no downsampling), its\n"
    "exponential moving average (thick line), validation losses (dots), axes with\n"
    "ticks and labels, and a title.\n";

int cli_plot_loss(int argc, char **argv)
{
    const char *out = NULL, *title = NULL;
    double smooth = 0.9;
    cli_opt opts[] = {
        {"--out", CLI_PATH, &out, 0, 0, "PATH", NULL,
         "the SVG to write (required; written atomically)", 0, 0},
        {"--title", CLI_STR, &title, 0, 0, "TEXT", NULL,
         "title (default: \"Training loss\" and the log's name)", 0, 0},
        {"--smooth", CLI_FLOAT, &smooth, 0, 1, "X", NULL,
         "EMA weight of the past in [0, 1) (default 0.9; 0 = none)", CLI_HI_OPEN, 0},
    };
    cli_cmd cmd = {
        "plot-loss", plot_loss_usage, plot_loss_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    const char *in = cmd.n_pos ? cmd.pos[0] : NULL;
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

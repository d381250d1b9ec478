/* needle init: a fresh random base checkpoint in upstream's format. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "io/checkpoint.h"

static const char *init_usage =
    "usage: needle init OUT.pkl [--preset tiny|needle2|tiny3|tiny3b|needle3] [shape options]\n"
    "                   [--seed N]\n";
static const char *init_about =
    "Write a fresh random base checkpoint (format_version 2 pickle, float32) with\n"
    "upstream's initialisers, readable by upstream needle and by `needle eval`.\n";

static int parse_list(const char *flag, const char *s, int *out, int *n, int max)
{
    *n = 0;
    if (!*s)
        return 0; /* empty list: e.g. no engram sites */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        long long v;
        if (*n >= max) {
            fprintf(stderr, "needle: %s takes at most %d values\n", flag, max);
            return -1;
        }
        if (cli_parse_int(flag, tok, 0, 1 << 20, &v))
            return -1;
        out[(*n)++] = (int)v;
    }
    return 0;
}

#define FIELD(flag, field, lo, hi)                                                                 \
    {                                                                                              \
        flag, CLI_INT, &ov.field, lo, hi, "N", NULL, "override the preset's " #field, 0, 0         \
    }

int cli_init(int argc, char **argv)
{
    const char *preset = "needle2", *layers = NULL, *orders = NULL;
    long long seed = 0;
    double rope_theta = 0;
    /* the shape options land here, then go over the preset's fields */
    san_config cfg, ov;
    memset(&ov, 0, sizeof ov);
    cli_opt opts[] = {
        {"--preset", CLI_ENUM, &preset, 0, 0, "NAME", "tiny|needle2|tiny3|tiny3b|needle3",
         "tiny (upstream's test shape: vocab 8192, d 64, 4 heads, 2 kv heads, 2 layers, seq 128, "
         "engram layer 1, 64 slots, 2 lanes), needle2 (the released base; default), needle3 "
         "(Needle 3's released shape: d 768, 12 heads, 2 kv heads, 20 layers, qk/v head dims "
         "48/64, sliding window 1024 with global layers 4,9,14,19, q/k/v conv taps 3, engram "
         "layers 3,7,11,15,19, context 8192), tiny3 or tiny3b (every Needle 3 feature at a test "
         "size)",
         0, 0},
        FIELD("--vocab", vocab_size, 16, 1 << 24),
        FIELD("--d-model", d_model, 2, 1 << 15),
        FIELD("--attn-dim", attn_dim, 2, 1 << 15),
        FIELD("--heads", num_heads, 1, 1024),
        FIELD("--kv-heads", num_kv_heads, 1, 1024),
        FIELD("--layers", num_layers, 1, 1024),
        FIELD("--max-seq-len", max_seq_len, 2, 1 << 20),
        FIELD("--lanes", mhc_lanes, 1, 16),
        FIELD("--engram-slots", engram_slots, 1, 1 << 24),
        FIELD("--engram-heads", engram_heads, 0, 1024),
        {"--engram-layers", CLI_STR, &layers, 0, 0, "A,B", NULL,
         "override the preset's engram layers (comma-separated; empty: none)", 0, 0},
        {"--engram-orders", CLI_STR, &orders, 0, 0, "A,B", NULL,
         "override the preset's engram n-gram orders (comma-separated, each >= 1)", 0, 0},
        {"--rope-theta", CLI_FLOAT, &rope_theta, 1, 0, "X", NULL,
         "override the preset's rope_theta", CLI_LO_OPEN | CLI_NO_HI, 0},
        {"--seed", CLI_I64, &seed, 0, (double)(1LL << 62), "N", NULL,
         "random seed (default 0); same seed, same bytes", 0, 0},
    };
    cli_cmd cmd = {"init", init_usage, init_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    if (san_config_preset(&cfg, preset))
        return cli_usage_error("init", "%s", nd_last_error());
    for (size_t k = 0; k < CLI_NOPTS(opts); k++)
        if (opts[k].given && opts[k].kind == CLI_INT) /* the same field of cfg */
            *(int *)((char *)&cfg + ((char *)opts[k].target - (char *)&ov)) =
                *(int *)opts[k].target;
    if (cli_opts_given(&cmd, "--rope-theta"))
        cfg.rope_theta = rope_theta;
    if (layers &&
        parse_list("--engram-layers", layers, cfg.engram_layers, &cfg.n_sites, SAN_MAX_SITES))
        return 2;
    if (orders &&
        parse_list("--engram-orders", orders, cfg.engram_orders, &cfg.n_orders, SAN_MAX_ORDERS))
        return 2;
    int attn_set = cli_opts_given(&cmd, "--attn-dim");
    if (cmd.n_pos < 1)
        return cli_usage_error("init", "missing output path");
    const char *out = cmd.pos[0];
    if (!attn_set && cfg.generation != 3)
        cfg.attn_dim = cfg.d_model;
    if (attn_set && cfg.generation == 3)
        return cli_usage_error("init", "--attn-dim is a Needle 2 field (Needle 3 presets have "
                                       "qk/v head dims)");
    for (int i = 0; i < cfg.n_orders; i++)
        if (cfg.engram_orders[i] < 1)
            return cli_usage_error("init", "--engram-orders values must be >= 1");

    san_model m;
    if (san_model_create(&m, &cfg))
        return cli_fail(NULL);
    san_model_init_random(&m, (uint64_t)seed);
    pv *tree = ckpt_fresh_tree(&m, (uint64_t)seed);
    int rc = tree ? ckpt_file_save(tree, out) : ND_ENOMEM;
    pv_decref(tree);
    if (rc) {
        san_model_free(&m);
        return cli_fail(NULL);
    }
    fprintf(stderr, "  %-9s %s  %.2fM params  d=%d L=%d H=%d G=%d lanes=%d seed=%lld\n", "wrote",
            out, (double)m.numel / 1e6, cfg.d_model, cfg.num_layers, cfg.num_heads,
            cfg.num_kv_heads, cfg.mhc_lanes, seed);
    san_model_free(&m);
    return 0;
}

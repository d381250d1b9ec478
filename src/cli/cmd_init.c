/* needle init: a fresh random base checkpoint in upstream's format. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/status.h"
#include "io/checkpoint.h"

static const char *init_help =
    "usage: needle init OUT.pkl [--preset tiny|needle2] [shape options] [--seed N]\n"
    "\n"
    "Write a fresh random base checkpoint (format_version 2 pickle, float32) with\n"
    "upstream's initialisers, readable by upstream needle and by `needle eval`.\n"
    "\n"
    "  --preset NAME        tiny (upstream's test shape: vocab 8192, d 64, 4 heads,\n"
    "                       2 kv heads, 2 layers, seq 128, engram layer 1, 64 slots,\n"
    "                       2 lanes) or needle2 (the released base; default)\n"
    "  --vocab N  --d-model N  --attn-dim N  --heads N  --kv-heads N  --layers N\n"
    "  --max-seq-len N  --lanes N  --engram-layers A,B  --engram-orders A,B\n"
    "  --engram-slots N  --engram-heads N  --rope-theta X\n"
    "                       override single fields of the preset\n"
    "  --seed N             random seed (default 0); same seed, same bytes\n";

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

int cli_init(int argc, char **argv)
{
    const char *out = NULL, *preset = "needle2";
    long long seed = 0;
    san_config cfg;
    /* first pass: the preset, so field overrides apply on top of it */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[i + 1];
    if (san_config_preset(&cfg, preset))
        return cli_usage_error("init", "%s", nd_last_error());
    int attn_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(init_help, stdout);
            return 0;
        }
        if (a[0] != '-' || a[1] != '-') {
            if (out)
                return cli_usage_error("init", "unexpected argument '%s'", a);
            out = a;
            continue;
        }
        if (i + 1 >= argc)
            return cli_usage_error("init", "%s needs a value", a);
        const char *v = argv[++i];
        long long x;
        struct {
            const char *flag;
            int *field;
            long long lo, hi;
        } ints[] = {
            {"--vocab", &cfg.vocab_size, 16, 1 << 24},
            {"--d-model", &cfg.d_model, 2, 1 << 15},
            {"--attn-dim", &cfg.attn_dim, 2, 1 << 15},
            {"--heads", &cfg.num_heads, 1, 1024},
            {"--kv-heads", &cfg.num_kv_heads, 1, 1024},
            {"--layers", &cfg.num_layers, 1, 1024},
            {"--max-seq-len", &cfg.max_seq_len, 2, 1 << 20},
            {"--lanes", &cfg.mhc_lanes, 1, 16},
            {"--engram-slots", &cfg.engram_slots, 1, 1 << 24},
            {"--engram-heads", &cfg.engram_heads, 0, 1024},
        };
        int done = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
            if (!strcmp(a, ints[k].flag)) {
                if (cli_parse_int(a, v, ints[k].lo, ints[k].hi, &x))
                    return 2;
                *ints[k].field = (int)x;
                if (!strcmp(a, "--attn-dim"))
                    attn_set = 1;
                done = 1;
            }
        if (done)
            continue;
        if (!strcmp(a, "--preset")) {
            continue;
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_int(a, v, 0, 1LL << 62, &seed))
                return 2;
        } else if (!strcmp(a, "--rope-theta")) {
            if (cli_parse_double(a, v, &cfg.rope_theta) || cfg.rope_theta <= 1)
                return cli_usage_error("init", "--rope-theta must be a number > 1");
        } else if (!strcmp(a, "--engram-layers")) {
            if (parse_list(a, v, cfg.engram_layers, &cfg.n_sites, SAN_MAX_SITES))
                return 2;
        } else if (!strcmp(a, "--engram-orders")) {
            if (parse_list(a, v, cfg.engram_orders, &cfg.n_orders, SAN_MAX_ORDERS))
                return 2;
        } else {
            return cli_usage_error("init", "unknown option '%s'", a);
        }
    }
    if (!out)
        return cli_usage_error("init", "missing output path");
    if (!attn_set)
        cfg.attn_dim = cfg.d_model;
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

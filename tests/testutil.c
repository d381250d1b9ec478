#include "testutil.h"

#include <math.h>
#include <stdlib.h>

#include "core/status.h"
#include "core/tuning.h"
#include "io/cact.h"
#include "model/params.h"

int tu_failures, tu_checks;

/* A test program is an entry point: the library's switches (NEEDLE_QKERNEL
 * ... set by ctest) from the environment, before main() (core/tuning.h). A
 * test that changes one with setenv calls nd_tuning_refresh() again. */
__attribute__((constructor)) static void tu_tuning_from_env(void)
{
    if (nd_tuning_refresh()) {
        fprintf(stderr, "%s\n", nd_last_error());
        exit(2);
    }
}

double tu_rel_err(const float *a, const float *b, long n, double floor)
{
    double md = 0, mb = floor;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md))
            md = d; /* NaN propagates as a huge error */
        if (fabs(b[i]) > mb)
            mb = fabs(b[i]);
    }
    return md / mb;
}

int tu_finish(const char *name)
{
    printf("%s: %d checks, %d failures\n", name, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

void tu_small_config(san_config *cfg)
{
    san_config_default(cfg);
    cfg->vocab_size = 64;
    cfg->d_model = 24;
    cfg->attn_dim = 32;
    cfg->num_heads = 4;
    cfg->num_kv_heads = 2;
    cfg->num_layers = 3;
    cfg->max_seq_len = 64;
    cfg->mhc_lanes = 3;
    cfg->n_sites = 2;
    cfg->engram_layers[0] = 0;
    cfg->engram_layers[1] = 2;
    cfg->n_orders = 2;
    cfg->engram_orders[0] = 2;
    cfg->engram_orders[1] = 3;
    cfg->engram_slots = 13;
}

unsigned char *tu_archive(const san_model *m, const nd_tokenizer *tok, int bits, int kv_window,
                          size_t *len)
{
    unsigned char *blob = NULL, *buf = NULL;
    size_t blen = 0;
    CHECK(nd_tokenizer_write_blob(tok, &blob, &blen) == 0);
    cact_write_opts o = {0};
    o.bits = bits;
    o.kv_window = kv_window;
    o.tokenizer = blob;
    o.tokenizer_len = blen;
    int rc = cact_write_mem(m, NULL, &o, &buf, len, NULL);
    CHECK_MSG(rc == 0, "%s", nd_last_error());
    free(blob);
    return rc ? NULL : buf;
}

void tu_small_needle2(san_model *m, unsigned seed)
{
    san_config c;
    san_config_preset(&c, "needle2");
    c.d_model = c.attn_dim = 256;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.num_layers = 2;
    c.engram_layers[0] = 0;
    c.engram_layers[1] = 1;
    c.engram_slots = 512;
    CHECK(san_model_create(m, &c) == 0);
    san_model_init_random(m, seed);
}

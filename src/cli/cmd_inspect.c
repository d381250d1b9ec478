/* needle inspect: print a .cact archive's header, codebooks and tensor
 * table, or a safetensors file's metadata and tensor table; or dump one
 * tensor (dequantised) as float32. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fileio.h"
#include "core/status.h"
#include "io/cact.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/cq.h"

static const char *inspect_usage =
    "usage: needle inspect X.cact|X.safetensors [--dequant NAME [--out FILE]]\n"
    "       needle inspect CKPT.pkl\n";
static const char *inspect_about =
    "Validate a .cact archive and print its header geometry, codebooks and the\n"
    "tensor table (index, name, dtype, shape, bits, group, offset, bytes).\n"
    "A safetensors file (checkpoint or adapter, told by its content) is\n"
    "validated the same way and shown as its metadata (key = value) and its\n"
    "tensor table (index, name, dtype, shape, offset, bytes).\n"
    "A pickle checkpoint is loaded as `needle eval` loads it: its generation\n"
    "(Needle 2 or 3, from the content), its config as the model reads it and the\n"
    "model's tensors (name, shape).\n";

static void print_codebooks(const cact_file *f);

/* the v3 header (export.py 3.x), every field in file order */
static void print_header3(const cact_file *f, const char *path)
{
    const cact_header3 *h = &f->h3;
    printf("file            %s  (%zu bytes)\n", path, f->len);
    printf("generation      Needle 3\n");
    printf("tag             0x%08X\n", h->tag);
    printf("num_tensors     %u\n", h->num_tensors);
    printf("kv_window       %u\n", h->kv_window);
    printf("kv_bits         %u\n", h->kv_bits);
    printf("vocab           %u\n", h->vocab);
    printf("out_vocab       %u\n", h->out_vocab);
    printf("d_model         %u\n", h->d_model);
    printf("num_heads       %u\n", h->num_heads);
    printf("num_kv_heads    %u\n", h->num_kv_heads);
    printf("num_layers      %u\n", h->num_layers);
    printf("qk_head_dim     %u\n", h->qk_head_dim);
    printf("v_head_dim      %u\n", h->v_head_dim);
    printf("max_seq_len     %u\n", h->max_seq_len);
    printf("hada_n          %u\n", h->hada_n);
    printf("mhc_lanes       %u\n", h->mhc_lanes);
    printf("sliding_window  %u\n", h->sliding_window);
    printf("global_mask     0x%08X%08X\n", h->global_mask_hi, h->global_mask_lo);
    printf("global_layers   [");
    uint64_t gm = (uint64_t)h->global_mask_hi << 32 | h->global_mask_lo;
    for (int i = 0, k = 0; i < 64; i++)
        if (gm >> i & 1)
            printf("%s%d", k++ ? ", " : "", i);
    printf("]\n");
    printf("qkv_conv_taps   %u\n", h->qkv_conv_taps);
    printf("engram_slots    %u\n", h->engram_slots);
    printf("engram_sub_dim  %u\n", h->engram_sub_dim);
    printf("engram_tables   %u\n", h->num_engram_tables);
    printf("conv_taps       %u\n", h->engram_conv_taps);
    printf("conv_dilation   %u\n", h->engram_conv_dilation);
    printf("seed_heads      %u\n", h->engram_seed_heads);
    printf("engram_orders   [");
    for (uint32_t i = 0; i < h->num_engram_orders && i < 4; i++)
        printf("%s%u", i ? ", " : "", h->engram_orders[i]);
    printf("]\nengram_sites    [");
    for (uint32_t i = 0; i < h->num_engram_sites && i < CACT3_MAX_SITES; i++)
        printf("%s%u", i ? ", " : "", h->engram_sites[i]);
    printf("]\nrope_theta      %.9g\n", (double)h->rope_theta);
    printf("codebook_len    %u\n", h->codebook_len);
    print_codebooks(f);
}

static void print_header(const cact_file *f, const char *path)
{
    if (f->generation == 3) {
        print_header3(f, path);
        return;
    }
    const cact_header *h = &f->hdr;
    printf("file            %s  (%zu bytes)\n", path, f->len);
    printf("tag             0x%08X\n", h->tag);
    printf("num_tensors     %u\n", h->num_tensors);
    printf("kv_window       %u\n", h->kv_window);
    printf("kv_bits         %u\n", h->kv_bits);
    printf("vocab           %u\n", h->vocab);
    printf("d_model         %u\n", h->d_model);
    printf("num_heads       %u\n", h->num_heads);
    printf("num_kv_heads    %u\n", h->num_kv_heads);
    printf("num_layers      %u\n", h->num_layers);
    printf("head_dim        %u\n", h->head_dim);
    printf("max_seq_len     %u\n", h->max_seq_len);
    printf("hada_n          %u\n", h->hada_n);
    printf("mhc_lanes       %u\n", h->mhc_lanes);
    printf("engram_slots    %u\n", h->engram_slots);
    printf("engram_sub_dim  %u\n", h->engram_sub_dim);
    printf("engram_tables   %u\n", h->num_engram_tables);
    printf("conv_taps       %u\n", h->engram_conv_taps);
    printf("conv_dilation   %u\n", h->engram_conv_dilation);
    printf("engram_orders   [");
    for (uint32_t i = 0; i < h->num_engram_orders; i++)
        printf("%s%u", i ? ", " : "", h->engram_orders[i]);
    printf("]\nengram_sites    [");
    for (uint32_t i = 0; i < h->num_engram_sites; i++)
        printf("%s%u", i ? ", " : "", h->engram_sites[i]);
    printf("]\nrope_theta      %.9g\n", (double)h->rope_theta);
    printf("codebook_len    %u\n", h->codebook_len);
    print_codebooks(f);
}

static void print_codebooks(const cact_file *f)
{
    const cact_header *h = &f->hdr;
    float ref[CQ_HEADER_CODEBOOK_LEN];
    int std = h->codebook_len == CQ_HEADER_CODEBOOK_LEN && !cq_header_codebooks(CQ_GROUP, ref) &&
              !memcmp(ref, f->codebook, sizeof ref);
    uint32_t o = 0;
    for (int b = 2; b <= 4 && o < h->codebook_len; b++) {
        printf("codebook cb%d   ", b);
        for (uint32_t k = 0; k < (1u << b) && o < h->codebook_len; k++, o++)
            printf(" %.9g", (double)f->codebook[o]);
        printf("\n");
    }
    if (o < h->codebook_len)
        printf("codebook extra  %u floats\n", h->codebook_len - o);
    printf("codebooks       %s\n",
           std ? "standard (Lloyd-Max N(0,1) / sqrt(128), as upstream)" : "NON-STANDARD");
}

static void shape_text(char *shape, size_t cap, int ndim, const int64_t *dims)
{
    size_t n = (size_t)snprintf(shape, cap, "(");
    for (int k = 0; k < ndim && n < cap; k++)
        n += (size_t)snprintf(shape + n, cap - n, "%s%lld", k ? ", " : "", (long long)dims[k]);
    if (n < cap)
        snprintf(shape + n, cap - n, ndim == 1 ? ",)" : ")");
}

static void print_st(const st_file *f, const char *path)
{
    printf("file            %s  (%zu bytes)\n", path, f->len);
    printf("format          safetensors\n");
    printf("header_bytes    %llu\n", (unsigned long long)f->header_len);
    printf("kind            %s\n",
           st_meta_get(f, "scale") && !st_meta_get(f, "format_version") ? "adapter" : "checkpoint");
    printf("num_tensors     %zu\n", f->n);
    printf("metadata        %zu\n", f->n_meta);
    for (size_t i = 0; i < f->n_meta; i++) {
        /* one line each: long values (a config) are cut, control
         * characters shown as '?' */
        printf("  %s = ", f->meta[i].key);
        size_t n = f->meta[i].val_len;
        for (size_t k = 0; k < n && k < 400; k++) {
            unsigned char c = (unsigned char)f->meta[i].val[k];
            putchar(c < 0x20 || c == 0x7f ? '?' : c);
        }
        printf("%s\n", n > 400 ? " ..." : "");
    }
    printf("\n%5s  %-50s %-7s %-22s %12s %12s\n", "#", "name", "dtype", "shape", "offset", "bytes");
    for (size_t i = 0; i < f->n; i++) {
        const st_tensor *t = &f->t[i];
        char shape[200];
        shape_text(shape, sizeof shape, t->ndim, t->shape);
        printf("%5zu  %-50s %-7s %-22s %12llu %12llu\n", i, t->name, st_dtype_name(t->dtype), shape,
               (unsigned long long)t->begin, (unsigned long long)t->nbytes);
    }
}

/* `needle inspect` of a safetensors file: the table, or one tensor as
 * float32 into *w (malloc'd, *n floats). */
static int inspect_st(const char *path, const char *deq, float **w, size_t *n)
{
    st_file f;
    if (st_open(path, &f))
        return -1;
    if (!deq) {
        print_st(&f, path);
        st_close(&f);
        return 1;
    }
    const st_tensor *t = st_find(&f, deq);
    if (!t && deq[0] == '#') {
        char *end;
        unsigned long long k = strtoull(deq + 1, &end, 10);
        if (!*end && deq[1] && k < f.n)
            t = &f.t[k];
    }
    if (!t) {
        nd_error(ND_EARG, "%s has no tensor '%s' (see `needle inspect %s`)", path, deq, path);
        st_close(&f);
        return -1;
    }
    *n = (size_t)t->numel;
    *w = malloc((*n ? *n : 1) * sizeof **w);
    int rc = *w ? st_to_f32(t, *w) : nd_error(ND_ENOMEM, "out of memory");
    if (rc)
        nd_error_prefix(rc, "%s", path);
    st_close(&f);
    if (rc) {
        free(*w);
        return -1;
    }
    return 0;
}

static void print_table(const cact_file *f)
{
    printf("\n%5s  %-26s %-5s %-22s %4s %5s %12s %12s\n", "#", "name", "dtype", "shape", "bits",
           "group", "offset", "bytes");
    for (uint32_t i = 0; i < f->hdr.num_tensors; i++) {
        const cact_tensor *t = &f->t[i];
        char shape[64];
        size_t n = (size_t)snprintf(shape, sizeof shape, "(");
        for (int k = 0; k < t->ndim && n < sizeof shape; k++)
            n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%u", k ? ", " : "", t->shape[k]);
        if (n < sizeof shape)
            snprintf(shape + n, sizeof shape - n, t->ndim == 1 ? ",)" : ")");
        char bits[16] = "-";
        if (t->dtype == CACT_CQ)
            snprintf(bits, sizeof bits, "%s", t->bits == CQ_TERNARY ? "1.58" : "");
        if (t->dtype == CACT_CQ && t->bits != CQ_TERNARY)
            snprintf(bits, sizeof bits, "%u", t->bits);
        printf("%5u  %-26s %-5s %-22s %4s %5u %12llu %12llu\n", i, t->name,
               cact_dtype_name(t->dtype), shape, bits, t->group, (unsigned long long)t->offset,
               (unsigned long long)t->nbytes);
    }
}

static void print_ints(const char *key, const int *v, int n)
{
    printf("  %-20s (", key);
    for (int i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", v[i]);
    printf(")\n");
}

/* a checkpoint: generation, the config as read, the tensor table */
static int inspect_checkpoint(const char *path)
{
    san_model m;
    if (ckpt_load(path, &m, NULL))
        return cli_fail(NULL);
    const san_config *c = &m.cfg;
    const san_dims *D = &m.dims;
    printf("file            %s\n", path);
    printf("generation      Needle %d\n", c->generation);
    printf("parameters      %.2fM in %d tensors\n", (double)m.numel / 1e6, m.n_tensors);
    printf("config\n");
    printf("  %-20s %d\n  %-20s %d\n  %-20s %d\n  %-20s %d\n  %-20s %d\n", "vocab_size",
           c->vocab_size, "d_model", c->d_model, "num_heads", c->num_heads, "num_kv_heads",
           c->num_kv_heads, "num_layers", c->num_layers);
    printf("  %-20s %d\n  %-20s %d\n  %-20s %d\n", "max_seq_len", c->max_seq_len, "mhc_lanes",
           c->mhc_lanes, "engram_slots", c->engram_slots);
    print_ints("engram_orders", c->engram_orders, c->n_orders);
    print_ints("engram_layers", c->engram_layers, c->n_sites);
    if (c->generation == 3) {
        printf("  %-20s %d (head dims: qk %d, v %d)\n", "qk_head_dim", c->qk_head_dim, D->hd,
               D->v_hd);
        printf("  %-20s %d\n", "v_head_dim", c->v_head_dim);
        printf("  %-20s %d\n", "sliding_window", c->sliding_window);
        print_ints("global_layers", c->global_layers, c->n_global);
        printf("  %-20s %d\n  %-20s %d\n  %-20s %d\n", "qkv_conv_taps", c->qkv_conv_taps,
               "out_vocab", c->out_vocab, "engram_seed_heads", c->engram_seed_heads);
        printf("  %-20s %s\n  %-20s %s\n", "attention_gate",
               c->attention_gate == SAN_GATE_HEADWISE ? "headwise" : "elementwise",
               "hada_factor_mode",
               c->hada_factor_mode == SAN_HADA_BLOCK_UNTIED ? "block_untied" : "shared");
        print_ints("engram_bank_ids", c->engram_bank_ids, c->n_bank_ids);
        printf("  %-20s (", "cla_pairs");
        for (int i = 0; i < c->n_cla; i++)
            printf("%s(%d, %d)", i ? ", " : "", c->cla_pairs[i][0], c->cla_pairs[i][1]);
        printf(")\n");
    } else {
        printf("  %-20s %d\n", "attn_dim", c->attn_dim);
    }
    printf("tensors\n");
    for (int i = 0; i < m.n_tensors; i++) {
        const san_tensor *t = &m.tensors[i];
        printf("  %-52s (", t->name);
        for (int k = 0; k < t->ndim; k++)
            printf("%s%lld", k ? ", " : "", (long long)t->shape[k]);
        printf(")\n");
    }
    san_model_free(&m);
    return 0;
}

int cli_inspect(int argc, char **argv)
{
    const char *deq = NULL, *out = NULL;
    cli_opt opts[] = {
        {"--dequant", CLI_STR, &deq, 0, 0, "NAME", NULL,
         "write tensor NAME (an export name such as layer00.q_proj, a safetensors tensor name, or "
         "#INDEX) as little-endian float32 to stdout (safetensors: F32, F16, BF16, F64)",
         0, 0},
        {"--out", CLI_PATH, &out, 0, 0, "FILE", NULL,
         "with --dequant: write to FILE (atomically) instead; - is stdout. FILE must be a regular "
         "file (or new), not the archive",
         0, 0},
    };
    cli_cmd cmd = {"inspect", inspect_usage, inspect_about, NULL, opts, CLI_NOPTS(opts), 1, {0}, 0};
    CLI_PARSE(&cmd, argc, argv);
    const char *path = cmd.n_pos ? cmd.pos[0] : NULL;
    if (!path)
        return cli_usage_error("inspect", "missing archive path");
    if (out && !deq)
        return cli_usage_error("inspect", "--out goes with --dequant");
    if (out && !strcmp(out, "-"))
        out = NULL; /* stdout */
    if (cli_check_output(out, "archive", path, (const char *)NULL))
        return 1;
    /* a pickle (protocol 2+ starts with 0x80) is a checkpoint */
    FILE *fp = fopen(path, "rb");
    int first = fp ? fgetc(fp) : EOF;
    if (fp)
        fclose(fp);
    if (first == 0x80) {
        if (deq)
            return cli_usage_error("inspect", "--dequant reads .cact archives, not checkpoints");
        return inspect_checkpoint(path);
    }
    float *w;
    size_t n;
    int rc;
    if (ckpt_file_is_safetensors(path) || ckpt_path_is_safetensors(path)) {
        rc = inspect_st(path, deq, &w, &n);
        if (rc < 0)
            return cli_fail(NULL);
        if (rc > 0)
            return 0;
        goto write_floats;
    }
    cact_file f;
    if (cact_read_file(path, &f))
        return cli_fail(NULL);
    if (!deq) {
        print_header(&f, path);
        print_table(&f);
        cact_free(&f);
        return 0;
    }
    int idx = cact_find(&f, deq);
    if (idx < 0) {
        fprintf(stderr, "needle: %s has no tensor '%s' (see `needle inspect %s`)\n", path, deq,
                path);
        cact_free(&f);
        return 1;
    }
    rc = cact_dequant(&f, idx, &w, &n);
    cact_free(&f);
    if (rc)
        return cli_fail(NULL);
write_floats:;
    /* the host is little-endian on every platform we build for; write
     * bytes explicitly anyway */
    unsigned char *b = malloc(n * 4 + 1);
    if (!b) {
        free(w);
        nd_error(ND_ENOMEM, "out of memory");
        return cli_fail(NULL);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], 4);
        for (int k = 0; k < 4; k++)
            b[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
    }
    free(w);
    if (out) {
        rc = nd_write_file_atomic(out, b, n * 4);
    } else if (fwrite(b, 1, n * 4, stdout) != n * 4 || fflush(stdout)) {
        rc = nd_error(ND_EIO, "writing to stdout failed: %s", strerror(errno));
    }
    free(b);
    return rc ? cli_fail(NULL) : 0;
}

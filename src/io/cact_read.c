#define _POSIX_C_SOURCE 200809L
/* .cact reading: parse and check a mapped or loaded archive, name its
 * tensors, dequantise one. The writer is cact.c. */
#include "io/cact.h"

#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/fp16.h"
#include "core/status.h"
#include "io/cact_bytes.h"
#include "model/cq.h"

#define MAX_TENSORS (1u << 20)
#define MAX_CODEBOOK (1u << 16)

/* ------------------------------------------------------------------ */
/* reading                                                             */

const char *cact_dtype_name(int dtype)
{
    switch (dtype) {
    case CACT_FP16: return "FP16";
    case CACT_FP32: return "FP32";
    case CACT_CQ: return "CQ";
    case CACT_RAW: return "RAW";
    default: return "?";
    }
}

uint64_t cact_numel(const cact_tensor *t)
{
    if (t->dtype == CACT_RAW)
        return t->nbytes;
    uint64_t n = 1;
    for (int i = 0; i < t->ndim && i < 4; i++)
        n *= t->shape[i];
    return n;
}

/* positional export names, as upstream's _tensors() lists them */
static void name_tensors(cact_file *f)
{
    const cact_header *h = &f->hdr;
    uint64_t n = h->num_tensors, L = h->num_layers, S = h->num_engram_sites;
    static const char *per_layer[14] = {
        "norm_in",  "q_proj",    "k_proj",    "v_proj",   "q_norm", "k_norm", "gate_proj",
        "out_proj", "post_norm", "attn_gate", "pre_hada", "d1",     "d2",     "d3"};
    static const char *mhc[9] = {"mhc_a_pre",   "mhc_a_post",   "mhc_a_res",
                                 "mhc_b_pre",   "mhc_b_post",   "mhc_b_res",
                                 "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"};
    static const char *eng[4] = {"tables", "key_proj", "value_proj", "taps"};
    uint64_t base = 1 + 14 * L + 9 + 4 * S + 1;
    int tok = n && f->t[n - 1].dtype == CACT_RAW;
    for (uint64_t i = 0; i < n; i++) {
        char *nm = f->t[i].name;
        size_t cap = sizeof f->t[i].name;
        if (L > MAX_TENSORS || base > n) {
            snprintf(nm, cap, "#%llu", (unsigned long long)i);
        } else if (i == 0) {
            snprintf(nm, cap, "embedding");
        } else if (i < 1 + 14 * L) {
            uint64_t k = i - 1;
            snprintf(nm, cap, "layer%02llu.%s", (unsigned long long)(k / 14), per_layer[k % 14]);
        } else if (i < 1 + 14 * L + 9) {
            snprintf(nm, cap, "%s", mhc[i - 1 - 14 * L]);
        } else if (i < base - 1) {
            uint64_t k = i - (1 + 14 * L + 9);
            snprintf(nm, cap, "engram%llu.%s", (unsigned long long)(k / 4), eng[k % 4]);
        } else if (i == base - 1) {
            snprintf(nm, cap, "final_norm");
        } else if (tok && i == n - 1) {
            snprintf(nm, cap, "tokenizer");
        } else if (i == base) {
            snprintf(nm, cap, "heads.manifest");
        } else {
            uint64_t k = i - base - 1, head = k / 3;
            static const char *part[3] = {"probes", "proj", "bias"};
            /* the manifest's codes name the heads (1 contrastive, 2 confidence) */
            const char *hn = NULL;
            const cact_tensor *man = &f->t[base];
            if (man->dtype == CACT_FP16 && head < man->nbytes / 2) {
                const unsigned char *p = f->data + man->offset + 2 * head;
                float code = nd_half_to_float((uint16_t)(p[0] | p[1] << 8));
                hn = code == 1.0f ? "contrastive_head" : code == 2.0f ? "confidence_head" : NULL;
            }
            if (hn)
                snprintf(nm, cap, "%s.%s", hn, part[k % 3]);
            else
                snprintf(nm, cap, "head%llu.%s", (unsigned long long)head, part[k % 3]);
        }
    }
}

/* 0, or 1 when the geometry is out of range, 2 when the archive has too few tensors */
static int layout3(const cact_file *f, cact3_layout *lay)
{
    memset(lay, 0, sizeof *lay);
    lay->manifest = -1;
    const cact_header3 *h = &f->h3;
    uint64_t n = h->num_tensors, L = h->num_layers, S = h->num_engram_sites;
    if (L > 64 || S > CACT3_MAX_SITES)
        return 1;
    lay->per_layer = h->qkv_conv_taps ? 27 : 24;
    lay->first_mhc = (uint32_t)(1 + lay->per_layer * L);
    lay->first_perm = lay->first_mhc + 9;
    lay->first_engram = lay->first_perm + 2;
    lay->final_norm = (uint32_t)(lay->first_engram + 4 * S);
    lay->tokenizer = n && f->t[n - 1].dtype == CACT_RAW;
    if ((uint64_t)lay->final_norm + 1 + (uint64_t)lay->tokenizer > n)
        return 2;
    if (lay->final_norm + 1 + (uint64_t)lay->tokenizer < n)
        lay->manifest = lay->final_norm + 1;
    return 0;
}

int cact3_layout_of(const cact_file *f, cact3_layout *lay)
{
    if (f->generation != 3)
        return nd_error(ND_EARG, "not a Needle 3 archive");
    const cact_header3 *h = &f->h3;
    switch (layout3(f, lay)) {
    case 1:
        return nd_error(ND_EFORMAT, "cact header: %u layers / %u engram sites (at most 64 / %d)",
                        h->num_layers, h->num_engram_sites, CACT3_MAX_SITES);
    case 2:
        return nd_error(ND_EFORMAT,
                        "cact: %u tensors, fewer than the header's geometry (%u layers, qkv "
                        "taps %u, %u engram sites) needs",
                        h->num_tensors, h->num_layers, h->qkv_conv_taps, h->num_engram_sites);
    default: return ND_OK;
    }
}

static const char *head3_key(float code)
{
    return code == 1.0f   ? "embedding_head"
           : code == 2.0f ? "confidence_head"
           : code == 3.0f ? "router_head"
                          : NULL;
}

static float fp16_at(const cact_file *f, const cact_tensor *t, uint64_t i)
{
    const unsigned char *p = f->data + t->offset + 2 * i;
    return nd_half_to_float((uint16_t)(p[0] | p[1] << 8));
}

/* export.py _tensors order (see cact.h) */
static void name_tensors3(cact_file *f)
{
    static const char *per_layer[25] = {
        "norm_in", "q_proj", "k_proj",    "v_proj",   "q_taps",    "k_taps",    "v_taps",
        "q_norm",  "k_norm", "gate_proj", "out_proj", "post_norm", "attn_gate", "pre_hada",
        "d1",      "d2",     "b2",        "d3",       "d4",        "w1a",       "w1b",
        "w2a",     "w2b",    "w3a",       "w3b"}; /* + cond_v, cond_u */
    static const char *mhc[9] = {"mhc_a_pre",   "mhc_a_post",   "mhc_a_res",
                                 "mhc_b_pre",   "mhc_b_post",   "mhc_b_res",
                                 "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"};
    static const char *eng[4] = {"tables", "key_proj", "value_proj", "taps"};
    static const char *part[7] = {"probes", "gain", "query",      "row_bias",
                                  "proj",   "bias", "calibration"};
    uint64_t n = f->h3.num_tensors;
    cact3_layout lay;
    int ok = !layout3(f, &lay);
    uint64_t head_at = 0, head = 0, head_len = 0;
    const char *hn = NULL;
    for (uint64_t i = 0; i < n; i++) {
        char *nm = f->t[i].name;
        size_t cap = sizeof f->t[i].name;
        if (!ok) {
            snprintf(nm, cap, "#%llu", (unsigned long long)i);
        } else if (i == 0) {
            snprintf(nm, cap, "embedding");
        } else if (i < lay.first_mhc) {
            uint64_t k = (i - 1) % lay.per_layer, l = (i - 1) / lay.per_layer;
            if (lay.per_layer == 24 && k >= 4)
                k += 3; /* no taps */
            snprintf(nm, cap, "layer%02llu.%s", (unsigned long long)l,
                     k < 25    ? per_layer[k]
                     : k == 25 ? "cond_v"
                               : "cond_u");
        } else if (i < lay.first_perm) {
            snprintf(nm, cap, "%s", mhc[i - lay.first_mhc]);
        } else if (i < lay.first_engram) {
            snprintf(nm, cap, "hada_p%llu", (unsigned long long)(i - lay.first_perm + 1));
        } else if (i < lay.final_norm) {
            uint64_t k = i - lay.first_engram;
            snprintf(nm, cap, "engram%llu.%s", (unsigned long long)(k / 4), eng[k % 4]);
        } else if (i == lay.final_norm) {
            snprintf(nm, cap, "final_norm");
        } else if (lay.tokenizer && i == n - 1) {
            snprintf(nm, cap, "tokenizer");
        } else if ((int64_t)i == lay.manifest) {
            snprintf(nm, cap, "heads.manifest");
            head_at = i + 1;
        } else {
            /* heads in manifest order, each 6 tensors (the router 7) */
            const cact_tensor *man = &f->t[lay.manifest];
            if (i == head_at) {
                hn = NULL;
                if (man->dtype == CACT_FP16 && head < man->nbytes / 2)
                    hn = head3_key(fp16_at(f, man, head));
                head_len = hn && !strcmp(hn, "router_head") ? 7 : 6;
                head++;
            }
            uint64_t k = i - head_at;
            if (k + 1 == head_len)
                head_at = i + 1;
            if (hn)
                snprintf(nm, cap, "%s.%s", hn, part[k < 7 ? k : 6]);
            else
                snprintf(nm, cap, "head%llu.%s", (unsigned long long)(head - 1),
                         part[k < 7 ? k : 6]);
        }
    }
}

static int check_record(const cact_file *f, uint32_t i, uint64_t dir_end)
{
    const cact_tensor *t = &f->t[i];
    if (t->dtype < CACT_FP16 || t->dtype > CACT_RAW)
        return nd_error(ND_EFORMAT, "tensor %u: unknown dtype %u", i, t->dtype);
    if (t->ndim > 4)
        return nd_error(ND_EFORMAT, "tensor %u: ndim %u > 4", i, t->ndim);
    if (t->offset < dir_end || t->offset > f->len || t->nbytes > f->len - t->offset)
        return nd_error(ND_EFORMAT,
                        "tensor %u: blob [%llu, +%llu) lies outside the data area [%llu, %zu)", i,
                        (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                        (unsigned long long)dir_end, f->len);
    uint64_t numel = 1;
    for (int k = 0; k < t->ndim; k++) {
        numel *= t->shape[k];
        if (numel > (1ull << 40))
            return nd_error(ND_EFORMAT, "tensor %u: shape is implausibly large", i);
    }
    switch (t->dtype) {
    case CACT_FP16:
    case CACT_FP32: {
        uint64_t es = t->dtype == CACT_FP16 ? 2 : 4;
        if (t->nbytes != numel * es)
            return nd_error(ND_EFORMAT, "tensor %u: %s blob is %llu bytes, shape needs %llu", i,
                            cact_dtype_name(t->dtype), (unsigned long long)t->nbytes,
                            (unsigned long long)(numel * es));
        break;
    }
    case CACT_CQ: {
        if (t->ndim != 2)
            return nd_error(ND_EFORMAT, "tensor %u: CQ tensor must be 2-D, has ndim %u", i,
                            t->ndim);
        if (!cq_bits_valid((int)t->bits))
            return nd_error(ND_EFORMAT, "tensor %u: CQ bits %u unsupported", i, t->bits);
        if (t->group < 8 || t->group > 4096 || (t->group & (t->group - 1)))
            return nd_error(ND_EFORMAT, "tensor %u: CQ group %u unsupported", i, t->group);
        size_t need = cq_blob_bytes(t->shape[0], t->shape[1], (int)t->bits, (int)t->group);
        if (need != t->nbytes)
            return nd_error(ND_EFORMAT,
                            "tensor %u: CQ blob is %llu bytes, [%u, %u] at %u bits "
                            "needs %zu",
                            i, (unsigned long long)t->nbytes, t->shape[0], t->shape[1], t->bits,
                            need);
        break;
    }
    default: break;
    }
    return ND_OK;
}

static int parse_body(const unsigned char *b, size_t len, cact_file *f, size_t hsize);
static int parse3(const unsigned char *b, size_t len, cact_file *f);

int cact_parse(const void *buf, size_t len, cact_file *f)
{
    memset(f, 0, sizeof *f);
    const unsigned char *b = buf;
    f->data = b;
    f->len = len;
    if (len >= 4 && get_u32(b) == CACT3_TAG)
        return parse3(b, len, f);
    if (len < CACT_HEADER_SIZE)
        return nd_error(ND_EFORMAT,
                        "not a .cact archive: %zu bytes, shorter than the %d-byte "
                        "header",
                        len, CACT_HEADER_SIZE);
    f->generation = 2;
    cact_header *h = &f->hdr;
    uint32_t *fields[29] = {&h->tag,
                            &h->num_tensors,
                            &h->codebook_len,
                            &h->kv_window,
                            &h->kv_bits,
                            &h->vocab,
                            &h->d_model,
                            &h->num_heads,
                            &h->num_kv_heads,
                            &h->num_layers,
                            &h->head_dim,
                            &h->max_seq_len,
                            &h->hada_n,
                            &h->mhc_lanes,
                            &h->engram_slots,
                            &h->engram_sub_dim,
                            &h->num_engram_tables,
                            &h->engram_conv_taps,
                            &h->engram_conv_dilation,
                            &h->num_engram_orders,
                            &h->engram_orders[0],
                            &h->engram_orders[1],
                            &h->engram_orders[2],
                            &h->engram_orders[3],
                            &h->num_engram_sites,
                            &h->engram_sites[0],
                            &h->engram_sites[1],
                            &h->engram_sites[2],
                            &h->engram_sites[3]};
    for (int i = 0; i < 29; i++)
        *fields[i] = get_u32(b + 4 * i);
    h->rope_theta = get_f32(b + 116);
    if (h->tag != CACT_TAG)
        return nd_error(ND_EFORMAT,
                        "not a .cact archive: tag 0x%08X, expected 0x%08X (Needle 2) or "
                        "0x%08X (Needle 3)",
                        h->tag, CACT_TAG, CACT3_TAG);
    if (h->num_engram_orders > 4 || h->num_engram_sites > 4)
        return nd_error(ND_EFORMAT, "header: %u engram orders / %u sites, at most 4 each",
                        h->num_engram_orders, h->num_engram_sites);
    return parse_body(b, len, f, CACT_HEADER_SIZE);
}

/* the codebooks and the directory after a header of hsize bytes */
static int parse_body(const unsigned char *b, size_t len, cact_file *f, size_t hsize)
{
    cact_header *h = &f->hdr;
    if (h->codebook_len > MAX_CODEBOOK || (uint64_t)hsize + (uint64_t)h->codebook_len * 4 > len)
        return nd_error(ND_EFORMAT, "header: codebook of %u floats runs past the end (%zu bytes)",
                        h->codebook_len, len);
    uint64_t dir = (uint64_t)hsize + (uint64_t)h->codebook_len * 4;
    if (h->num_tensors > MAX_TENSORS || (uint64_t)h->num_tensors * CACT_REC_SIZE > len - dir)
        return nd_error(ND_EFORMAT, "header: directory of %u records runs past the end (%zu bytes)",
                        h->num_tensors, len);
    uint64_t dir_end = dir + (uint64_t)h->num_tensors * CACT_REC_SIZE;
    f->codebook = malloc((size_t)h->codebook_len * sizeof(float) + 1);
    f->t = calloc((size_t)h->num_tensors + 1, sizeof *f->t);
    if (!f->codebook || !f->t) {
        cact_free(f);
        return nd_error(ND_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < h->codebook_len; i++)
        f->codebook[i] = get_f32(b + hsize + 4 * (size_t)i);
    for (uint32_t i = 0; i < h->num_tensors; i++) {
        const unsigned char *r = b + dir + (size_t)i * CACT_REC_SIZE;
        cact_tensor *t = &f->t[i];
        t->dtype = r[0];
        t->ndim = r[1];
        t->pad = (uint16_t)(r[2] | r[3] << 8);
        for (int k = 0; k < 4; k++)
            t->shape[k] = get_u32(r + 4 + 4 * k);
        t->offset = get_u64(r + 20);
        t->nbytes = get_u64(r + 28);
        t->group = get_u32(r + 36);
        t->bits = get_u32(r + 40);
        int rc = check_record(f, i, dir_end);
        if (rc) {
            cact_free(f);
            return rc;
        }
    }
    if (f->generation == 3)
        name_tensors3(f);
    else
        name_tensors(f);
    return ND_OK;
}

static int parse3(const unsigned char *b, size_t len, cact_file *f)
{
    if (len < CACT3_HEADER_SIZE)
        return nd_error(ND_EFORMAT,
                        "not a Needle 3 .cact archive: %zu bytes, shorter than the %d-byte header",
                        len, CACT3_HEADER_SIZE);
    f->generation = 3;
    cact_header3 *h3 = &f->h3;
    cact3_decode_header(b, h3);
    if (h3->num_engram_orders > 4 || h3->num_engram_sites > CACT3_MAX_SITES)
        return nd_error(ND_EFORMAT, "header: %u engram orders / %u sites, at most 4 / %d",
                        h3->num_engram_orders, h3->num_engram_sites, CACT3_MAX_SITES);
    cact_header *h = &f->hdr;
    h->tag = h3->tag;
    h->num_tensors = h3->num_tensors;
    h->codebook_len = h3->codebook_len;
    h->kv_window = h3->kv_window;
    h->kv_bits = h3->kv_bits;
    h->vocab = h3->vocab;
    return parse_body(b, len, f, CACT3_HEADER_SIZE);
}

int cact_read_file(const char *path, cact_file *f)
{
    unsigned char *buf;
    size_t len;
    memset(f, 0, sizeof *f);
    int rc = nd_read_file(path, 0, &buf, &len);
    if (rc)
        return rc;
    rc = cact_parse(buf, len, f);
    if (rc) {
        free(buf);
        return nd_error_prefix(rc, "%s", path);
    }
    f->owned = buf;
    return ND_OK;
}

int cact_map_file(const char *path, cact_file *f)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cact_read_file(path, f); /* let the reader report it */
    struct stat st;
    void *p = MAP_FAILED;
    if (!fstat(fd, &st) && st.st_size > 0 && (uint64_t)st.st_size <= (uint64_t)SIZE_MAX)
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { /* a pipe, an empty file, no mmap: read it */
        close(fd);
        return cact_read_file(path, f);
    }
    int rc = cact_parse(p, (size_t)st.st_size, f);
    if (rc) {
        munmap(p, (size_t)st.st_size);
        close(fd);
        return nd_error_prefix(rc, "%s", path);
    }
    f->map = p;
    f->map_len = (size_t)st.st_size;
    f->map_fd = fd;
    f->has_fd = 1;
    return ND_OK;
}

int cact_own_copy(const void *buf, size_t len, cact_file *f)
{
    memset(f, 0, sizeof *f);
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy)
        return nd_error(ND_ENOMEM, "out of memory copying a %zu-byte archive", len);
    memcpy(copy, buf, len);
    int rc = cact_parse(copy, len, f);
    if (rc) {
        free(copy);
        return rc;
    }
    f->owned = copy;
    return ND_OK;
}

void cact_free(cact_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_len);
    if (f->has_fd)
        close(f->map_fd);
    free(f->owned);
    free(f->codebook);
    free(f->t);
    memset(f, 0, sizeof *f);
}

int cact_find(const cact_file *f, const char *name)
{
    if (name[0] == '#') {
        char *end;
        unsigned long v = strtoul(name + 1, &end, 10);
        return name[1] && !*end && v < f->hdr.num_tensors ? (int)v : -1;
    }
    for (uint32_t i = 0; i < f->hdr.num_tensors; i++)
        if (!strcmp(f->t[i].name, name))
            return (int)i;
    return -1;
}

int cact_dequant(const cact_file *f, int index, float **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (index < 0 || (uint32_t)index >= f->hdr.num_tensors)
        return nd_error(ND_EARG, "no tensor #%d", index);
    const cact_tensor *t = &f->t[index];
    if (t->dtype == CACT_RAW)
        return nd_error(ND_EARG, "%s is a RAW blob, not a float tensor", t->name);
    uint64_t numel = cact_numel(t);
    float *w = malloc((size_t)numel * sizeof *w + 1);
    if (!w)
        return nd_error(ND_ENOMEM, "out of memory for %llu floats", (unsigned long long)numel);
    const unsigned char *p = f->data + t->offset;
    int rc = ND_OK;
    if (t->dtype == CACT_FP16) {
        for (uint64_t i = 0; i < numel; i++)
            w[i] = nd_half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    } else if (t->dtype == CACT_FP32) {
        for (uint64_t i = 0; i < numel; i++)
            w[i] = get_f32(p + 4 * i);
    } else {
        rc = cq_dequantize(p, (size_t)t->nbytes, t->shape[0], t->shape[1], (int)t->bits,
                           (int)t->group, w);
        if (rc)
            rc = nd_error_prefix(rc, "%s", t->name);
    }
    if (rc) {
        free(w);
        return rc;
    }
    *out = w;
    *n = (size_t)numel;
    return ND_OK;
}

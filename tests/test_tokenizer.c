/* Tokenizer unit tests on the shipped models/tokenizer.model: blob round
 * trip, decode rules, robustness on hostile text, and a linear-time check. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "testutil.h"
#include "text/render.h"
#include "text/tokenizer.h"

static int same_encoding(const nd_tokenizer *a, const nd_tokenizer *b, const char *s, size_t n)
{
    nd_idvec x = {0}, y = {0};
    int ok = !nd_tokenizer_encode(a, s, n, &x) && !nd_tokenizer_encode(b, s, n, &y) && x.n == y.n &&
             (!x.n || !memcmp(x.v, y.v, x.n * sizeof *x.v));
    nd_idvec_free(&x);
    nd_idvec_free(&y);
    return ok;
}

static char *decode(const nd_tokenizer *t, const int32_t *ids, size_t n)
{
    char *s = NULL;
    size_t len;
    if (nd_tokenizer_decode(t, ids, n, &s, &len))
        return NULL;
    return s;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void)
{
    nd_tokenizer *t, *b;
    if (nd_tokenizer_load("models/tokenizer.model", &t)) {
        fprintf(stderr, "%s\n", nd_last_error());
        return 1;
    }
    CHECK(nd_tokenizer_vocab_size(t) == 8192);
    CHECK(nd_tokenizer_pad_id(t) == 0 && nd_tokenizer_eos_id(t) == 1);
    CHECK(nd_tokenizer_bos_id(t) == 2 && nd_tokenizer_unk_id(t) == 3);
    CHECK(nd_tokenizer_piece_to_id(t, "<|im_start|>", 12) == 4);
    CHECK(nd_tokenizer_piece_to_id(t, "</tool_result>", 14) == 13);
    CHECK(nd_tokenizer_type(t, 4) == ND_SPM_USER_DEFINED);

    /* blob: write, read back, identical pieces and encodings */
    unsigned char *blob;
    size_t blen;
    CHECK(nd_tokenizer_write_blob(t, &blob, &blen) == 0);
    CHECK(nd_tokenizer_from_blob(blob, blen, &b) == 0);
    CHECK(nd_tokenizer_vocab_size(b) == 8192);
    for (int i = 0; i < 8192; i++) {
        size_t l1, l2;
        const char *p1 = nd_tokenizer_piece(t, i, &l1), *p2 = nd_tokenizer_piece(b, i, &l2);
        CHECK_MSG(l1 == l2 && !memcmp(p1, p2, l1) &&
                      nd_tokenizer_score(t, i) == nd_tokenizer_score(b, i),
                  "piece %d", i);
    }
    const char *texts[] = {"<|im_start|>user\n<tools>[]</tools>\nhi<|im_end|>", "  two  spaces  ",
                           "caf\xc3\xa9 \xf0\x9f\x98\x80", "\xff\xfe\x00z",
                           "plain text with the weather in London"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        CHECK_MSG(same_encoding(t, b, texts[i], strlen(texts[i]) + (i == 3)), "text %zu", i);
    /* hostile blobs */
    nd_tokenizer *bad;
    CHECK(nd_tokenizer_from_blob(blob, blen - 1, &bad) != 0);
    CHECK(nd_tokenizer_from_blob(blob, 10, &bad) != 0);
    blob[24 + 4] = 9; /* first piece type */
    CHECK(nd_tokenizer_from_blob(blob, blen, &bad) != 0 && strstr(nd_last_error(), "type"));
    free(blob);
    nd_tokenizer_free(b);

    /* decode rules */
    nd_idvec ids = {0};
    const char *s = "hello  world\nnext";
    CHECK(nd_tokenizer_encode(t, s, strlen(s), &ids) == 0);
    char *d = decode(t, ids.v, ids.n);
    CHECK(d && !strcmp(d, s));
    free(d);
    int32_t ctl[] = {2, 1, 0};
    d = decode(t, ctl, 3);
    CHECK(d && !strcmp(d, ""));
    free(d);
    int32_t unk[] = {3};
    d = decode(t, unk, 1);
    CHECK(d && !strcmp(d, " \xE2\x81\x87 "));
    free(d);
    /* byte pieces: <0xC3><0xA9> -> "é"; a stray <0xFF> -> U+FFFD */
    int32_t bytes[] = {14 + 0xC3, 14 + 0xA9, 14 + 0xFF};
    d = decode(t, bytes, 3);
    CHECK(d && !strcmp(d, "\xc3\xa9\xef\xbf\xbd"));
    free(d);
    int32_t oob[] = {8192};
    CHECK(decode(t, oob, 1) == NULL && strstr(nd_last_error(), "8192"));

    /* empty text -> no ids; all-invalid text -> byte pieces of U+FFFD */
    ids.n = 0;
    CHECK(nd_tokenizer_encode(t, "", 0, &ids) == 0 && ids.n == 0);
    CHECK(nd_tokenizer_encode(t, "\x80", 1, &ids) == 0 && ids.n >= 3);

    /* fit_max_len and pack, as upstream */
    CHECK(nd_fit_max_len(0, 1024) == 128 && nd_fit_max_len(129, 1024) == 256);
    CHECK(nd_fit_max_len(5000, 1024) == 1024 && nd_fit_max_len(10, 64) == 64);
    int32_t in[5] = {2, 7, 8, 9, 1}, out[4];
    float mask[4];
    CHECK(nd_render_pack(in, 5, 2, 4, 0, out, mask) == 1);
    CHECK(out[3] == 9 && mask[0] == 0 && mask[1] == 0 && mask[2] == 1 && mask[3] == 1);
    CHECK(nd_render_pack(in, 3, 3, 4, 0, out, mask) == 0 && out[3] == 0 && mask[3] == 0);

    /* the segment cache never changes results */
    nd_tok_cache *cache = nd_tok_cache_new();
    const char *rep = "<tools>[{\"name\":\"get_weather\"}]</tools> the weather  in\tLondon "
                      "the weather in London\n\xff caf\xc3\xa9 the weather";
    for (int k = 0; k < 3; k++) {
        nd_idvec x = {0}, y = {0};
        CHECK(nd_tokenizer_encode(t, rep, strlen(rep) - (size_t)k * 5, &x) == 0);
        CHECK(nd_tokenizer_encode_cached(t, cache, rep, strlen(rep) - (size_t)k * 5, &y) == 0);
        CHECK(x.n == y.n && !memcmp(x.v, y.v, x.n * sizeof *x.v));
        nd_idvec_free(&x);
        nd_idvec_free(&y);
    }
    nd_tok_cache_free(cache);

    /* no quadratic blow-up: 4 MB without spaces and 4 MB of one repeated
     * character (worst cases for naive BPE) encode quickly. */
    size_t n = 4 << 20;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = "abcdefghij"[i % 10];
    double t0 = now();
    ids.n = 0;
    CHECK(nd_tokenizer_encode(t, big, n, &ids) == 0);
    memset(big, 'a', n);
    ids.n = 0;
    CHECK(nd_tokenizer_encode(t, big, n, &ids) == 0);
    double dt = now() - t0;
    CHECK_MSG(dt < 20.0, "8 MB took %.1f s", dt);
    free(big);
    nd_idvec_free(&ids);
    nd_tokenizer_free(t);
    return tu_finish("test_tokenizer");
}

/* SHA-256 against FIPS 180-4 vectors (one-shot and fed in odd pieces), and
 * the retrieval top-k: best first, ties in declaration order, k > n. */
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "engine/retrieval.h"
#include "testutil.h"

static void hex(const unsigned char *d, char *out)
{
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static int digest_is(const void *data, size_t len, const char *want)
{
    unsigned char d[32];
    char h[65];
    nd_sha256(data, len, d);
    hex(d, h);
    return !strcmp(h, want);
}

int main(void)
{
    CHECK(digest_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    CHECK(digest_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    CHECK(digest_is(two, strlen(two),
                    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    /* a million 'a', fed in pieces of 1..127 bytes (every buffer boundary) */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    nd_sha256_ctx s;
    nd_sha256_init(&s);
    size_t off = 0;
    for (size_t step = 1; off < 1000000; step = step % 127 + 1) {
        size_t n = off + step > 1000000 ? 1000000 - off : step;
        nd_sha256_update(&s, a + off, n);
        off += n;
    }
    unsigned char d[32];
    char h[65];
    nd_sha256_final(&s, d);
    hex(d, h);
    CHECK_MSG(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "%s",
              h);
    /* 55, 56, 63, 64 bytes: the padding spills into a second block or not */
    CHECK(digest_is(a, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"));
    CHECK(digest_is(a, 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"));
    CHECK(digest_is(a, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"));
    free(a);

    /* top-k on unit vectors in 2-D: q = (1, 0), scores = first coordinate */
    float emb[7 * 2] = {0.1f, 0, 0.9f, 0, 0.5f, 0, 0.9f, 0, -1, 0, 0.5f, 0, 0.7f, 0};
    nd_tool_index ix = {7, 2, emb, 0, ND_INDEX_NONE, ""};
    float q[2] = {1, 0};
    int sel[ND_RETRIEVAL_TOP_K];
    nd_tool_index_top(&ix, q, 5, sel);
    int want[5] = {1, 3, 6, 2, 5}; /* ties 1/3 and 2/5 keep declaration order */
    CHECK(!memcmp(sel, want, sizeof want));
    nd_tool_index small = {2, 2, emb, 0, ND_INDEX_NONE, ""};
    int sel2[ND_RETRIEVAL_TOP_K] = {-1, -1, -1, -1, -1};
    nd_tool_index_top(&small, q, 5, sel2);
    CHECK(sel2[0] == 1 && sel2[1] == 0 && sel2[2] == -1);
    return tu_finish("test_sha256_topk");
}

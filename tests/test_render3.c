/* The Needle 3 (cactus-needle 3.x) chat template, ids and loss mask next to
 * Needle 2's, on the shipped models/tokenizer.model.
 *
 * The expected strings were written out by reading upstream's
 * render_example (2.x and 3.x finetune.py); the expected ids were worked
 * out from the tokenizer's piece table (ids below), not produced by an
 * encoder at test time:
 *   specials  BOS 2, EOS 1, PAD 0; markers <|im_start|> 4, <|im_end|> 5,
 *             <think> 6, </think> 7, <tools> 8, </tools> 9, <tool_call> 10,
 *             </tool_call> 11 (matched atomically, so they cut the text)
 *   "▁" 8116  (the dummy prefix: each text starts with a marker, and no
 *             piece joins ▁ to '<')
 *   "\n" has no piece: byte fallback <0x0A> 24
 *   user 485, assistant 501, hi 1388, go 1635, be 546, ▁brief 1111
 *   "system" is no piece, nor "sy"/"sys"; it merges as s 8119, y 8131,
 *             ste 7710, m 8128
 *   [ 8140, ] 8141, x 8148 ("[]" and "[x" are no pieces)
 *   [{" 428, name 315, ":" 272, "} 1320
 *   é has no piece: <0xC3> 209 <0xA9> 183; "\" neither: <0x5C> 106;
 *   u 8126, 00 1905, e 8114, 9 8168 ("\u00e9" as Needle 2 writes it) */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "io/jsonl.h"
#include "testutil.h"
#include "text/pyjson.h"
#include "text/render.h"
#include "text/tokenizer.h"

#define NELEM(a) (sizeof(a) / sizeof *(a))

/* "<|im_start|>user\n<tools>[]</tools>\nhi<|im_end|>\n<|im_start|>assistant\n" */
#define USER_HI_IDS 4, 485, 24, 8, 8140, 8141, 9, 24, 1388, 5, 24, 4, 501, 24
/* "<tool_call>[]</tool_call><|im_end|>" */
#define CALL_EMPTY_IDS 10, 8140, 8141, 11, 5

#define USER_HI "<|im_start|>user\n<tools>[]</tools>\nhi<|im_end|>\n<|im_start|>assistant\n"

/* Render one JSONL line with a generation; 0 on success (prompt/target
 * then malloc'd copies), else the error code with nd_last_error() set. */
static int render_line(const char *line, int gen, char **prompt, char **target)
{
    nd_jsonl_opts o = {.generation = gen};
    nd_dataset d;
    *prompt = *target = NULL;
    int rc = nd_jsonl_load_mem(line, strlen(line), "t.jsonl", &o, &d);
    if (rc)
        return rc;
    if (d.n != 1) {
        nd_dataset_free(&d);
        return -1000;
    }
    *prompt = malloc(d.ex[0].prompt_len + 1);
    *target = malloc(d.ex[0].target_len + 1);
    memcpy(*prompt, d.ex[0].prompt, d.ex[0].prompt_len + 1);
    memcpy(*target, d.ex[0].target, d.ex[0].target_len + 1);
    nd_dataset_free(&d);
    return 0;
}

static void expect_render(const char *line, int gen, const char *want_p, const char *want_t)
{
    char *p, *t;
    int rc = render_line(line, gen, &p, &t);
    CHECK_MSG(rc == 0, "v%d %s: %s", gen, line, rc ? nd_last_error() : "");
    if (rc)
        return;
    CHECK_MSG(!strcmp(p, want_p), "v%d %s prompt:\n  got  %s\n  want %s", gen, line, p, want_p);
    CHECK_MSG(!strcmp(t, want_t), "v%d %s target:\n  got  %s\n  want %s", gen, line, t, want_t);
    free(p);
    free(t);
}

static void expect_error(const char *line, int gen, const char *msg)
{
    char *p, *t;
    int rc = render_line(line, gen, &p, &t);
    CHECK_MSG(rc != 0 && strstr(nd_last_error(), msg), "v%d %s: rc %d, error '%s', want '%s'", gen,
              line, rc, rc ? nd_last_error() : "", msg);
    if (!rc) {
        free(p);
        free(t);
    }
}

/* Token ids and mask of one line, padded to max_len (fit_max_len: 128). */
static void expect_ids(const nd_tokenizer *tok, const char *line, int gen, const int32_t *want,
                       size_t n_want, size_t n_prompt)
{
    nd_jsonl_opts o = {.generation = gen};
    nd_dataset d;
    nd_token_set ts;
    if (nd_jsonl_load_mem(line, strlen(line), "t.jsonl", &o, &d)) {
        CHECK_MSG(0, "load %s: %s", line, nd_last_error());
        return;
    }
    CHECK(d.generation == (gen ? gen : 2));
    if (nd_dataset_tokenize(&d, tok, 1024, &ts)) {
        CHECK_MSG(0, "tokenize %s: %s", line, nd_last_error());
        nd_dataset_free(&d);
        return;
    }
    CHECK(ts.n == 1 && ts.max_len == 128);
    CHECK_MSG(ts.len[0] == (int32_t)n_want, "v%d %s: %d ids, want %zu", gen, line, ts.len[0],
              n_want);
    for (size_t i = 0; i < ts.max_len; i++) {
        int32_t w = i < n_want ? want[i] : 0;
        float m = i >= n_prompt && i < n_want ? 1.0f : 0.0f;
        CHECK_MSG(ts.ids[i] == w && ts.mask[i] == m,
                  "v%d %s: position %zu: id %d mask %g, want %d %g", gen, line, i, ts.ids[i],
                  ts.mask[i], w, m);
    }
    nd_token_set_free(&ts);
    nd_dataset_free(&d);
}

static void check_ids(const nd_tokenizer *tok)
{
    /* no reasoning: Needle 3 has no <think> block at all */
    const char *l1 = "{\"query\":\"hi\",\"tools\":[],\"answers\":[]}\n";
    static const int32_t v3_1[] = {2, 8116, USER_HI_IDS, 8116, CALL_EMPTY_IDS, 1};
    expect_ids(tok, l1, 3, v3_1, NELEM(v3_1), 16);
    static const int32_t v2_1[] = {2, 8116, USER_HI_IDS, 8116, 6, 7, 24, CALL_EMPTY_IDS, 1};
    expect_ids(tok, l1, 2, v2_1, NELEM(v2_1), 16);
    expect_ids(tok, l1, 0, v2_1, NELEM(v2_1), 16); /* 0 = the default, Needle 2 */

    /* system and reasoning, both stripped; the <think> block with newlines */
    const char *l2 = "{\"query\":\"hi\",\"system\":\"  be brief \\n\",\"reasoning\":\"\\n go \\t\","
                     "\"tools\":[],\"answers\":[]}\n";
    static const int32_t v3_2[] = {2,    8116, 4, 8119, 8131,           7710, 8128, 24,
                                   546,  1111, 5, 24,   USER_HI_IDS,    8116, 6,    24,
                                   1635, 24,   7, 24,   CALL_EMPTY_IDS, 1};
    expect_ids(tok, l2, 3, v3_2, NELEM(v3_2), 1 + 11 + 14);

    /* non-ASCII in answers: raw UTF-8 (byte pieces) in 3, \u00e9 in 2 */
    const char *l3 = "{\"query\":\"hi\",\"tools\":[],\"answers\":[{\"name\":\"\\u00e9\"}]}\n";
    static const int32_t v3_3[] = {2,   8116, USER_HI_IDS, 8116, 10, 428, 315, 272,
                                   209, 183,  1320,        8141, 11, 5,   1};
    expect_ids(tok, l3, 3, v3_3, NELEM(v3_3), 16);
    static const int32_t v2_3[] = {2,    8116, USER_HI_IDS, 8116, 6,   7,    24,
                                   10,   428,  315,         272,  106, 8126, 1905,
                                   8114, 8168, 1320,        8141, 11,  5,    1};
    expect_ids(tok, l3, 2, v2_3, NELEM(v2_3), 16);

    /* string-valued tools and answers (verbatim); whitespace-only
     * reasoning (an ideographic space among ASCII ones) means no <think> */
    const char *l4 = "{\"query\":\"hi\",\"tools\":\"[x]\",\"answers\":\"[]\","
                     "\"reasoning\":\" \\u3000 \"}\n";
    static const int32_t v3_4[] = {2,  8116, 4, 485, 24, 8,   8140, 8148, 8141,           9,
                                   24, 1388, 5, 24,  4,  501, 24,   8116, CALL_EMPTY_IDS, 1};
    expect_ids(tok, l4, 3, v3_4, NELEM(v3_4), 17);
}

static void check_text(void)
{
    /* the examples above, as bytes */
    expect_render("{\"query\":\"hi\",\"tools\":[],\"answers\":[]}", 3, USER_HI,
                  "<tool_call>[]</tool_call><|im_end|>");
    expect_render("{\"query\":\"hi\",\"tools\":[],\"answers\":[]}", 2, USER_HI,
                  "<think></think>\n<tool_call>[]</tool_call><|im_end|>");
    expect_render("{\"query\":\"hi\",\"system\":\"  be brief \\n\",\"reasoning\":\"\\n go \\t\"}",
                  3, "<|im_start|>system\nbe brief<|im_end|>\n" USER_HI,
                  "<think>\ngo\n</think>\n<tool_call>[]</tool_call><|im_end|>");
    /* Needle 2 strips nothing */
    expect_render("{\"query\":\"hi\",\"system\":\"  be brief \\n\",\"reasoning\":\"\\n go \\t\"}",
                  2, "<|im_start|>system\n  be brief \n<|im_end|>\n" USER_HI,
                  "<think>\n go \t</think>\n<tool_call>[]</tool_call><|im_end|>");
    /* the query is not stripped in either */
    expect_render("{\"query\":\" hi \"}", 3,
                  "<|im_start|>user\n<tools>[]</tools>\n hi <|im_end|>\n<|im_start|>assistant\n",
                  "<tool_call>[]</tool_call><|im_end|>");

    /* ensure_ascii=False: non-ASCII, DEL, U+2028 and emoji raw; quotes,
     * backslashes and C0 controls still escaped */
    const char *uni =
        "{\"query\":\"q\",\"tools\":[{\"name\":\"caf\\u00e9\",\"d\":\"\\u007f\\u2028\"}],"
        "\"answers\":[{\"name\":\"x\",\"arguments\":{\"t\":\"\\ud83d\\ude00\\t\\n\\u0001"
        "\\\"\\\\\",\"\\u00fc\":1e16}}]}";
    expect_render(uni, 3,
                  "<|im_start|>user\n<tools>[{\"name\":\"caf\xc3\xa9\",\"d\":\"\x7f\xe2\x80\xa8\"}]"
                  "</tools>\nq<|im_end|>\n<|im_start|>assistant\n",
                  "<tool_call>[{\"name\":\"x\",\"arguments\":{\"t\":\"\xf0\x9f\x98\x80\\t\\n\\u0001"
                  "\\\"\\\\\",\"\xc3\xbc\":1e+16}}]</tool_call><|im_end|>");
    expect_render(
        uni, 2,
        "<|im_start|>user\n<tools>[{\"name\":\"caf\\u00e9\",\"d\":\"\\u007f\\u2028\"}]"
        "</tools>\nq<|im_end|>\n<|im_start|>assistant\n",
        "<think></think>\n<tool_call>[{\"name\":\"x\",\"arguments\":{\"t\":\"\\ud83d\\ude00"
        "\\t\\n\\u0001\\\"\\\\\",\"\\u00fc\":1e+16}}]</tool_call><|im_end|>");
    /* a string-valued field stays verbatim in both (raw UTF-8 included) */
    expect_render("{\"query\":\"q\",\"tools\":\"[\\\"\\u00fc\\\"]\",\"function_calls\":\"[ ]\"}", 3,
                  "<|im_start|>user\n<tools>[\"\xc3\xbc\"]</tools>\nq<|im_end|>\n"
                  "<|im_start|>assistant\n",
                  "<tool_call>[ ]</tool_call><|im_end|>");

    /* (x or "").strip(): falsy values are "", Unicode whitespace goes,
     * U+200B (not str.isspace) stays */
    const char *falsy[] = {"null", "false", "0", "0.0", "\"\"", "[]", "{}", "\" \\u00a0\\u3000\""};
    for (size_t i = 0; i < NELEM(falsy); i++) {
        char line[160];
        snprintf(line, sizeof line, "{\"query\":\"hi\",\"system\":%s,\"reasoning\":%s}", falsy[i],
                 falsy[i]);
        expect_render(line, 3, USER_HI, "<tool_call>[]</tool_call><|im_end|>");
    }
    expect_render(
        "{\"query\":\"hi\",\"system\":\"\\u2003s\\u205f\",\"reasoning\":\"\\u200br\\u0085\"}", 3,
        "<|im_start|>system\ns<|im_end|>\n" USER_HI,
        "<think>\n\xe2\x80\x8br\n</think>\n<tool_call>[]</tool_call><|im_end|>");
    /* Needle 2: a whitespace system is truthy, so it is a turn */
    expect_render("{\"query\":\"hi\",\"system\":\" \"}", 2,
                  "<|im_start|>system\n <|im_end|>\n" USER_HI,
                  "<think></think>\n<tool_call>[]</tool_call><|im_end|>");

    /* errors */
    expect_error("{\"query\":\"hi\",\"reasoning\":null}", 2, "reasoning must be a string");
    expect_error("{\"query\":\"hi\",\"reasoning\":[\"x\"]}", 3, "reasoning must be a string");
    expect_error("{\"query\":\"hi\",\"system\":5}", 3, "system must be a string");
    expect_error("{\"query\":\"hi\",\"system\":true}", 3, "system must be a string");
    expect_error("{\"query\":7}", 3, "query must be a string");
    expect_error("{\"query\":\"hi\",\"tools\":7}", 3, "tools must be");
    /* a lone surrogate: Needle 2 escapes it, Needle 3 would hand it to
     * SentencePiece raw, which Python cannot encode */
    const char *sur = "{\"query\":\"hi\",\"answers\":[{\"name\":\"\\ud800\"}]}";
    expect_render(sur, 2, USER_HI,
                  "<think></think>\n<tool_call>[{\"name\":\"\\ud800\"}]</tool_call><|im_end|>");
    expect_error(sur, 3, "answers contains a lone surrogate");
    expect_error("{\"query\":\"hi\",\"reasoning\":\"\\udc00\"}", 3, "reasoning contains a lone");
    expect_error("{\"query\":\"hi\"}", 4, "unknown model generation 4");
    expect_error("{\"query\":\"hi\"}", 1, "unknown model generation 1");
}

/* 3.x's _encode uses fixed BOS 2 / EOS 1 / PAD 0, Needle 2 the tokenizer's */
static void check_special_ids(const nd_tokenizer *t)
{
    unsigned char *blob;
    size_t len;
    nd_tokenizer *odd;
    CHECK(nd_tokenizer_write_blob(t, &blob, &len) == 0);
    blob[4] = 3;               /* pad */
    blob[8] = 2, blob[12] = 1; /* eos, bos swapped */
    CHECK(nd_tokenizer_from_blob(blob, len, &odd) == 0);
    free(blob);
    const char *l = "{\"query\":\"hi\",\"tools\":[],\"answers\":[]}\n";
    static const int32_t v3[] = {2, 8116, USER_HI_IDS, 8116, CALL_EMPTY_IDS, 1};
    expect_ids(odd, l, 3, v3, NELEM(v3), 16);
    nd_jsonl_opts o = {.generation = 2};
    nd_dataset d;
    nd_token_set ts;
    CHECK(nd_jsonl_load_mem(l, strlen(l), "t.jsonl", &o, &d) == 0);
    CHECK(nd_dataset_tokenize(&d, odd, 1024, &ts) == 0);
    CHECK(ts.ids[0] == 1 && ts.ids[ts.len[0] - 1] == 2 && ts.ids[ts.max_len - 1] == 3);
    nd_token_set_free(&ts);
    nd_dataset_free(&d);
    nd_tokenizer_free(odd);
}

static void check_vocab(const nd_tokenizer *t)
{
    CHECK(nd_render_check_vocab(t, 2, 8192, "tok.model") == 0);
    CHECK(nd_render_check_vocab(t, 0, 8192, "tok.model") == 0);
    CHECK(nd_render_check_vocab(t, 2, 16384, "tok.model") != 0 &&
          strstr(nd_last_error(), "tok.model has 8192 pieces"));
    CHECK(nd_render_check_vocab(t, 3, 16384, "tok.model") == 0);
    CHECK(nd_render_check_vocab(t, 3, 8192, "tok.model") == 0);
    CHECK(nd_render_check_vocab(t, 3, 8191, "tok.model") != 0 &&
          strstr(nd_last_error(), "holds 8191"));
    CHECK(nd_render_check_vocab(t, 5, 8192, "tok.model") != 0);
}

/* A small blob: specials, the 24 markers of 3.x typed NORMAL, the 256
 * byte pieces, then "▁" and "a". */
static const char *const markers24[] = {
    "<|im_start|>", "<|im_end|>",   "<think>",       "</think>",       "<tools>",   "</tools>",
    "<tool_call>",  "</tool_call>", "<tool_result>", "</tool_result>", "<context>", "</context>",
    "<image>",      "</image>",     "<speech>",      "</speech>",      "<tts>",     "</tts>",
    "<imagen>",     "</imagen>",    "<extract>",     "</extract>",     "<schema>",  "</schema>"};

static void put_piece(nd_buf *b, const char *s, float score, int type)
{
    unsigned char rec[7];
    size_t n = strlen(s);
    memcpy(rec, &score, 4);
    rec[4] = (unsigned char)type;
    rec[5] = (unsigned char)(n & 0xff);
    rec[6] = (unsigned char)(n >> 8);
    nd_buf_put(b, (const char *)rec, 7);
    nd_buf_put(b, s, n);
}

static int blob_type(const unsigned char *blob, size_t len, int id)
{
    size_t off = 24;
    for (int i = 0; off + 7 <= len; i++) {
        size_t pl = (size_t)blob[off + 5] | (size_t)blob[off + 6] << 8;
        if (i == id)
            return blob[off + 4];
        off += 7 + pl;
    }
    return -1;
}

static void check_markers(void)
{
    nd_buf b = {0};
    unsigned char hdr[24] = {0};
    uint32_t n = 4 + 24 + 256 + 2;
    memcpy(hdr, &n, 4); /* little-endian host assumed by the test */
    hdr[4] = 0, hdr[8] = 1, hdr[12] = 2, hdr[16] = 3, hdr[20] = 1, hdr[21] = 1;
    nd_buf_put(&b, (const char *)hdr, 24);
    put_piece(&b, "<pad>", 0, 2);
    put_piece(&b, "</s>", 0, 2);
    put_piece(&b, "<s>", 0, 2);
    put_piece(&b, "<unk>", 0, 1);
    for (int i = 0; i < 24; i++)
        put_piece(&b, markers24[i], 0, 0);
    for (int i = 0; i < 256; i++) {
        char p[8];
        snprintf(p, sizeof p, "<0x%02X>", i);
        put_piece(&b, p, 0, 4);
    }
    put_piece(&b, "\xe2\x96\x81", -1, 0);
    put_piece(&b, "a", -2, 0);
    nd_tokenizer *t, *t2, *t3;
    CHECK(nd_tokenizer_from_blob((const unsigned char *)b.p, b.n, &t) == 0);
    nd_buf_free(&b);
    unsigned char *b2, *b3;
    size_t l2, l3;
    CHECK(nd_tokenizer_write_blob_gen(t, 2, &b2, &l2) == 0);
    CHECK(nd_tokenizer_write_blob_gen(t, 3, &b3, &l3) == 0);
    CHECK(nd_tokenizer_write_blob_gen(t, 4, &b3, &l3) != 0);
    for (int i = 4; i < 28; i++) {
        CHECK_MSG(blob_type(b2, l2, i) == (i < 14 ? 3 : 0), "v2 blob piece %d", i);
        CHECK_MSG(blob_type(b3, l3, i) == 3, "v3 blob piece %d", i);
    }
    CHECK(blob_type(b3, l3, 0) == 2 && blob_type(b3, l3, 3) == 1 && blob_type(b3, l3, 28) == 4 &&
          blob_type(b3, l3, 284) == 0);
    /* read back, the new markers are atomic only in the 3.x blob */
    CHECK(nd_tokenizer_from_blob(b2, l2, &t2) == 0);
    CHECK(nd_tokenizer_from_blob(b3, l3, &t3) == 0);
    const char *s = "<context>a</context><tools>";
    nd_idvec v2 = {0}, v3 = {0};
    CHECK(nd_tokenizer_encode(t2, s, strlen(s), &v2) == 0);
    CHECK(nd_tokenizer_encode(t3, s, strlen(s), &v3) == 0);
    static const int32_t want3[] = {284, 14, 285, 15, 8};
    CHECK(v3.n == NELEM(want3) && !memcmp(v3.v, want3, sizeof want3));
    int has_marker = 0;
    for (size_t i = 0; i < v2.n; i++)
        has_marker |= v2.v[i] == 14 || v2.v[i] == 15;
    CHECK(!has_marker && v2.n > 5 && v2.v[v2.n - 1] == 8);
    nd_idvec_free(&v2);
    nd_idvec_free(&v3);
    free(b2);
    free(b3);
    nd_tokenizer_free(t);
    nd_tokenizer_free(t2);
    nd_tokenizer_free(t3);
}

static void check_strip(void)
{
    const char *s = "\t\x0b\x1c \xc2\x85\xc2\xa0\xe1\x9a\x80x y\xe2\x80\x8a\xe2\x80\xa9\xe2\x80\xaf"
                    "\xe3\x80\x80\r\n";
    size_t n = strlen(s);
    nd_py_strip(&s, &n);
    CHECK(n == 3 && !memcmp(s, "x y", 3));
    const char *z = "\xe2\x80\x8bx\xef\xbb\xbf"; /* U+200B, U+FEFF: not whitespace */
    n = strlen(z);
    nd_py_strip(&z, &n);
    CHECK(n == strlen("\xe2\x80\x8bx\xef\xbb\xbf"));
    const char *e = " \xe3\x80\x80 ";
    n = strlen(e);
    nd_py_strip(&e, &n);
    CHECK(n == 0);
    /* a truncated multi-byte sequence is not a space */
    const char *c = "x\xe3\x80";
    n = 3;
    nd_py_strip(&c, &n);
    CHECK(n == 3);
}

int main(void)
{
    nd_tokenizer *t;
    if (nd_tokenizer_load("models/tokenizer.model", &t)) {
        fprintf(stderr, "%s\n", nd_last_error());
        return 1;
    }
    check_text();
    check_ids(t);
    check_special_ids(t);
    check_vocab(t);
    check_markers();
    check_strip();
    nd_tokenizer_free(t);
    return tu_finish("test_render3");
}

/* pyjson unit tests. With a file argument it is also the driver for
 * tests/test_pyjson.py: each input line is parsed and re-serialised
 * (argv[2] == "default" selects json.dumps' default separators). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "testutil.h"
#include "text/pyjson.h"

static int roundtrip(const char *in, int compact, const char *want)
{
    nd_pj_doc *d;
    if (nd_pj_parse(in, strlen(in), &d, NULL)) {
        fprintf(stderr, "parse failed for %s: %s\n", in, nd_last_error());
        return 0;
    }
    nd_buf b = {0};
    int ok = nd_pj_dump(nd_pj_root(d), compact, &b) == 0 && !strcmp(b.p, want);
    if (!ok)
        fprintf(stderr, "  %s -> %s (want %s)\n", in, b.p ? b.p : "(null)", want);
    nd_buf_free(&b);
    nd_pj_free(d);
    return ok;
}

static int fails(const char *in)
{
    nd_pj_doc *d;
    int rc = nd_pj_parse(in, strlen(in), &d, NULL);
    if (!rc)
        nd_pj_free(d);
    return rc != 0;
}

static int drive(const char *path, int compact)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        if (n && line[n - 1] == '\n')
            n--;
        nd_pj_doc *d;
        nd_buf b = {0};
        if (nd_pj_parse(line, (size_t)n, &d, NULL)) {
            printf("ERROR\n");
            continue;
        }
        if (nd_pj_dump(nd_pj_root(d), compact, &b))
            printf("ERROR\n");
        else
            printf("%s\n", b.p);
        nd_buf_free(&b);
        nd_pj_free(d);
    }
    free(line);
    fclose(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        return drive(argv[1], !(argc > 2 && !strcmp(argv[2], "default")));

    CHECK(
        roundtrip("[1.5,10.0,1e-05,1e16,-0.0,0.1,1,3]", 1, "[1.5,10.0,1e-05,1e+16,-0.0,0.1,1,3]"));
    CHECK(roundtrip("[1E5, 1e22, 123456789012345678.0, 5e-324, 0.0001, 1e15]", 1,
                    "[100000.0,1e+22,1.2345678901234568e+17,5e-324,0.0001,1000000000000000.0]"));
    CHECK(roundtrip("123456789012345678901234567890", 1, "123456789012345678901234567890"));
    CHECK(roundtrip("-0", 1, "0"));
    CHECK(roundtrip("[NaN, Infinity, -Infinity]", 1, "[NaN,Infinity,-Infinity]"));
    CHECK(roundtrip("{\"b\":1,\"a\":2,\"b\":3}", 1, "{\"b\":3,\"a\":2}"));
    CHECK(roundtrip("{\"b\":1, \"a\":[true,false,null]}", 0,
                    "{\"b\": 1, \"a\": [true, false, null]}"));
    CHECK(roundtrip("\"\\u00fc\xc3\xbc\xf0\x9f\x98\x80/\\/\\ud800x\\udc00\\ud83d\\ude00\"", 1,
                    "\"\\u00fc\\u00fc\\ud83d\\ude00//\\ud800x\\udc00\\ud83d\\ude00\""));
    CHECK(roundtrip("\"\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\\\"\\\\\"", 1,
                    "\"\\b\\f\\n\\r\\t\\u0001\\u001f\\u007f\\\"\\\\\""));
    CHECK(roundtrip("  {}  ", 1, "{}"));
    CHECK(roundtrip("[[],{},\"\"]", 0, "[[], {}, \"\"]"));
    CHECK(fails(""));
    CHECK(fails("[1,]"));
    CHECK(fails("{\"a\" 1}"));
    CHECK(fails("01"));
    CHECK(fails("1."));
    CHECK(fails("\"raw\ncontrol\""));
    CHECK(fails("\"bad \\x escape\""));
    CHECK(fails("\"\xff\""));
    CHECK(fails("\"\xed\xa0\x80\"")); /* UTF-8-encoded surrogate */
    CHECK(fails("[1] 2"));
    CHECK(fails("{'a':1}"));
    /* err_col is the message's column: the bad byte inside a string, not
     * where the string starts */
    {
        nd_pj_doc *d;
        size_t col = 0;
        CHECK(nd_pj_parse("[\"ab\x01\"]", 7, &d, &col) == ND_EFORMAT);
        CHECK(col == 5 && !strncmp(nd_last_error(), "column 5: ", 10));
        CHECK(nd_pj_parse("{\"a\": \"\\q\"}", 11, &d, &col) == ND_EFORMAT);
        CHECK(col == 8 && !strncmp(nd_last_error(), "column 8: ", 10));
        CHECK(nd_pj_parse("[1,\n x]", 7, &d, &col) == ND_EFORMAT);
        CHECK(col == 6 && !strncmp(nd_last_error(), "column 6: ", 10));
    }

    char deep[3001];
    memset(deep, '[', 1500);
    memset(deep + 1500, ']', 1500);
    deep[3000] = 0;
    CHECK(fails(deep) && strstr(nd_last_error(), "nesting"));
    char big[4400];
    memset(big, '7', 4301);
    big[4301] = 0;
    CHECK(fails(big));
    big[4300] = 0;
    CHECK(!fails(big));

    char buf[40];
    nd_pj_float_repr(2.0 / 3.0, buf);
    CHECK(!strcmp(buf, "0.6666666666666666"));
    nd_pj_float_repr(1e-7, buf);
    CHECK(!strcmp(buf, "1e-07"));
    nd_pj_float_repr(9007199254740993.0, buf);
    CHECK(!strcmp(buf, "9007199254740992.0"));
    return tu_finish("test_pyjson");
}

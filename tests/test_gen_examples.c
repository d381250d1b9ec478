/* gen/examples.c: reply parsing (bare, fenced, wrapped in prose, broken),
 * schema gate per answer, rendering gate, de-duplication and the counts;
 * gen/chat_reply.c: redaction before cutting and the reply envelope. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/chat_reply.h"
#include "gen/examples.h"
#include "testutil.h"

static const char tools_json[] =
    "[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}},"
    "{\"name\":\"set_timer\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"minutes\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":180}},"
    "\"required\":[\"minutes\"]}}]";

static size_t add(nd_gen_set *s, const char *reply)
{
    return nd_gen_add_reply(s, reply, strlen(reply), 0);
}

/* no run of 4+ bytes starting like key anywhere in s */
static int clean(const char *s, const char *key)
{
    for (; *s; s++) {
        size_t l = 0;
        while (key[l] && s[l] == key[l])
            l++;
        if (l >= 4)
            return 0;
    }
    return 1;
}

static void test_redaction(void)
{
    const char *key = "sk-or-v1-abcdef0123456789";
    char src[256], out[256];
    /* the key straddles the cut at every offset: redact first, then cut */
    for (size_t pad = 0; pad < 40; pad++) {
        memset(src, 'x', pad);
        snprintf(src + pad, sizeof src - pad, "%s tail", key);
        size_t n = nd_redact_into(out, sizeof out, src, strlen(src), key, 30);
        CHECK(n <= 30 && strlen(out) == n);
        CHECK(clean(out, key));
        CHECK(pad + 3 > 30 || strncmp(out + pad, "***", n - pad < 3 ? n - pad : 3) == 0);
    }
    /* a piece of the key cut short elsewhere, the key twice, a Bearer token */
    snprintf(src, sizeof src, "near 'sk-or-v1-ab' got %s%s; Authorization: bearer tok123 end", key,
             key);
    nd_redact_into(out, sizeof out, src, strlen(src), key, sizeof out);
    CHECK(strcmp(out, "near '***' got ******; Authorization: bearer *** end") == 0);
    /* under 4 bytes is not taken for the key; control bytes become spaces */
    nd_redact_into(out, sizeof out, "sk-\nline\r2\0x", 12, key, 100);
    CHECK(memcmp(out, "sk- line 2 x", 13) == 0);
    /* in place, never longer */
    snprintf(src, sizeof src, "Bearer %s!", key);
    nd_redact(src, key);
    CHECK(strcmp(src, "Bearer ***") == 0 || strcmp(src, "Bearer ***!") == 0);
    /* a cut never splits a UTF-8 sequence */
    nd_redact_into(out, sizeof out, "ab\xc3\xa9\xe2\x82\xac", 7, NULL, 5);
    CHECK(strcmp(out, "ab\xc3\xa9") == 0);
    nd_redact_into(out, sizeof out, "ab\xc3\xa9\xe2\x82\xac", 7, NULL, 3);
    CHECK(strcmp(out, "ab") == 0);
    /* no key: only control bytes change */
    nd_redact_into(out, sizeof out, "a\tb", 3, "", 10);
    CHECK(strcmp(out, "a b") == 0);
}

static void test_reply_envelope(void)
{
    const char *key = "sk-test-KEY-0001";
    char *content, err[320];
    size_t len;
    const char ok[] = "{\"choices\":[{\"message\":{\"content\":\"[1]\"}}]}";
    CHECK(nd_chat_parse_reply(ok, sizeof ok - 1, key, &content, &len, err, sizeof err) == 1);
    CHECK(len == 3 && strcmp(content, "[1]") == 0);
    free(content);
    const char e1[] = "{\"error\":{\"message\":\"bad key sk-test-KEY-0001\"}}";
    CHECK(nd_chat_parse_reply(e1, sizeof e1 - 1, key, &content, &len, err, sizeof err) == 0);
    CHECK(!content && strcmp(err, "the service answered an error: bad key ***") == 0);
    const char e2[] = "{\"error\":\"quota\"}";
    CHECK(nd_chat_parse_reply(e2, sizeof e2 - 1, key, &content, &len, err, sizeof err) == 0);
    CHECK(strcmp(err, "the service answered an error: quota") == 0);
    CHECK(nd_chat_parse_reply("{\"choices\":[]}", 14, key, &content, &len, err, sizeof err) == 0);
    CHECK(strstr(err, "no choices[0].message.content") != NULL);
    CHECK(nd_chat_parse_reply("<html>", 6, key, &content, &len, err, sizeof err) == 0);
    CHECK(strncmp(err, "the reply is not JSON (line 1 column", 36) == 0);
    /* the service's message is cut at 200 bytes, after redaction */
    char big[400];
    snprintf(big, sizeof big, "{\"error\":{\"message\":\"%0190d%s\"}}", 0, key);
    CHECK(nd_chat_parse_reply(big, strlen(big), key, &content, &len, err, sizeof err) == 0);
    CHECK(clean(err, key) && strstr(err, "***") != NULL);
}

/* no 4 bytes in a row of key anywhere in s (a piece from its middle too) */
static int no_piece(const char *s, const char *key)
{
    size_t kn = strlen(key);
    for (size_t i = 0; i + 4 <= kn; i++) {
        char piece[5];
        memcpy(piece, key + i, 4);
        piece[4] = 0;
        if (strstr(s, piece))
            return 0;
    }
    return 1;
}

/* The envelope through the library's own JSON parser (text/pyjson.c; the
 * library does not link jansson): where a body stops being JSON is said as
 * line and column with the text before it quoted, redacted as a whole. */
static void test_reply_not_json(void)
{
    const char *key = "sk-test-KEY-0001";
    char *content, err[320];
    size_t len;
    const char multi[] = "{\n  \"choices\": [\n  oops]}";
    CHECK(nd_chat_parse_reply(multi, sizeof multi - 1, key, &content, &len, err, sizeof err) == 0);
    CHECK(!content && strncmp(err, "the reply is not JSON (line 3 column 3: ", 40) == 0);
    CHECK(strstr(err, " near '{   \"choices\": [   o')") != NULL);
    /* the key 30 bytes before the bad byte: a 40-byte quote of the raw body
     * would start inside it; quoted from the redacted body it shows "***" */
    char body[128];
    snprintf(body, sizeof body, "{\"choices\": \"%s%030d\x01\"}", key, 0);
    CHECK(nd_chat_parse_reply(body, strlen(body), key, &content, &len, err, sizeof err) == 0);
    CHECK(strncmp(err, "the reply is not JSON (line 1 column 60: ", 41) == 0);
    CHECK(strstr(err, "***000") != NULL && no_piece(err, key));
    /* a bad UTF-8 byte is not quoted (the quote stays valid UTF-8) */
    const char bad[] = "{\"a\": \"\xc3\xa9\xff\"}";
    CHECK(nd_chat_parse_reply(bad, sizeof bad - 1, key, &content, &len, err, sizeof err) == 0);
    CHECK(strstr(err, "line 1 column 10: ") != NULL && strstr(err, "near '{\"a\": \"\xc3\xa9')"));
    CHECK(nd_chat_parse_reply("", 0, key, &content, &len, err, sizeof err) == 0);
    CHECK(strncmp(err, "the reply is not JSON (line 1 column 1: ", 40) == 0);
    CHECK(nd_chat_parse_reply(NULL, 0, key, &content, &len, err, sizeof err) == 0 && !content);
    /* content for the example parser holds no NUL */
    const char nul[] = "{\"choices\":[{\"message\":{\"content\":\"[1]\\u0000\"}}]}";
    CHECK(nd_chat_parse_reply(nul, sizeof nul - 1, key, &content, &len, err, sizeof err) == 0);
    CHECK(!content && strstr(err, "\\u0000") != NULL);
    /* escapes decoded; the first choice; "error": null next to no content */
    const char esc[] = "{\"choices\":[{\"message\":{\"content\":\"\\u00e9\\n\\\"\"}},"
                       "{\"message\":{\"content\":\"x\"}}],\"error\":null}";
    CHECK(nd_chat_parse_reply(esc, sizeof esc - 1, key, &content, &len, err, sizeof err) == 1);
    CHECK(len == 4 && strcmp(content, "\xc3\xa9\n\"") == 0);
    free(content);
    CHECK(nd_chat_parse_reply("{\"error\":null}", 14, key, &content, &len, err, sizeof err) == 0);
    CHECK(strcmp(err, "the service answered an error: (no message)") == 0);
}

int main(void)
{
    nd_pj_doc *doc;
    CHECK(nd_pj_parse(tools_json, sizeof tools_json - 1, &doc, NULL) == 0);
    const nd_pj *tools = nd_pj_root(doc);

    nd_buf prompt = {0};
    CHECK(nd_gen_user_prompt(tools, 7, 2, &prompt) == 0);
    CHECK(strstr(prompt.p, "Produce 7 varied examples as a JSON array") != NULL);
    CHECK(strstr(prompt.p, "about 2 off-topic") != NULL);
    CHECK(strstr(prompt.p, "\"set_timer\"") != NULL);
    nd_buf_free(&prompt);

    nd_gen_set *s;
    CHECK(nd_gen_set_new(tools, &s) == 0);
    /* bare array; key order of answers and arguments is free */
    CHECK(add(s, "[{\"query\":\"Weather in Oslo\",\"answers\":[{\"arguments\":{\"unit\":\"c\","
                 "\"city\":\"Oslo\"},\"name\":\"get_weather\"}]}]") == 1);
    /* fenced, with prose holding brackets around it */
    CHECK(add(s, "Sure [see below]:\n```json\n[{\"query\":\"hi\",\"reasoning\":\"none\","
                 "\"answers\":[]}]\n```\nDone [ok]") == 1);
    /* duplicate of the first: case, space and key order aside */
    CHECK(add(s, "[{\"query\":\"  WEATHER in oslo \",\"answers\":[{\"name\":\"get_weather\","
                 "\"arguments\":{\"city\":\"Oslo\",\"unit\":\"c\"}}]}]") == 0);
    CHECK(nd_gen_get_counts(s)->duplicate == 1);
    /* schema breaks: each dropped and counted */
    const char *bad[] = {
        "[{\"query\":\"q1\",\"answers\":[{\"name\":\"nope\",\"arguments\":{}}]}]",
        "[{\"query\":\"q2\",\"answers\":[{\"name\":\"set_timer\",\"arguments\":{}}]}]",
        "[{\"query\":\"q3\",\"answers\":[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":0}}]}]",
        "[{\"query\":\"q4\",\"answers\":[{\"name\":\"set_timer\",\"arguments\":{\"minutes\":2.5}}]}"
        "]",
        "[{\"query\":\"q5\",\"answers\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":1}}]}]",
        "[{\"query\":\"q6\",\"answers\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"a\","
        "\"x\":1}}]}]",
        "[{\"query\":\"q7\",\"answers\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"a\"},"
        "\"id\":3}]}]",
        "[{\"query\":\"\",\"answers\":[]}]",
        "[{\"query\":\"q9\",\"answers\":{}}]",
        "[{\"query\":\"q10\",\"reasoning\":5,\"answers\":[]}]",
        "[{\"answers\":[]}]",
        "[3]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(add(s, bad[i]) == 0, "%s", bad[i]);
    CHECK(nd_gen_get_counts(s)->invalid == sizeof bad / sizeof bad[0]);
    CHECK(strstr(nd_gen_first_invalid(s), "break the tool schemas") != NULL);
    /* no array at all, and a truncated one */
    CHECK(add(s, "I cannot help with that.") == 0);
    char first[256];
    snprintf(first, sizeof first, "%s", nd_gen_first_unparsable(s));
    CHECK(strncmp(first, "reply ", 6) == 0 &&
          strstr(first, ": no [...] array in it; it begins \"I cannot help") != NULL);
    CHECK(add(s, "[{\"query\":\"x\",\"answers\":[") == 0);
    CHECK(nd_gen_get_counts(s)->unparsable == 2);
    CHECK(strcmp(nd_gen_first_unparsable(s), first) == 0); /* the first stays */

    CHECK(nd_gen_size(s) == 2);
    size_t n;
    const char *line = nd_gen_line(s, 0, &n);
    CHECK(n == strlen(line));
    CHECK(strncmp(line, "{\"query\": \"Weather in Oslo\", \"answers\": [", 41) == 0);
    CHECK(strstr(line, "\"tools\": [{\"name\": \"get_weather\"") != NULL);
    line = nd_gen_line(s, 1, &n);
    CHECK(strncmp(line, "{\"query\": \"hi\", \"reasoning\": \"none\", \"answers\": []", 49) == 0);

    /* the cap stops keeping (and counting) once the set is full */
    const char *three = "[{\"query\":\"a\",\"answers\":[]},{\"query\":\"b\",\"answers\":[]},"
                        "{\"query\":\"c\",\"answers\":[]}]";
    CHECK(nd_gen_add_reply(s, three, strlen(three), 3) == 1);
    CHECK(nd_gen_size(s) == 3 && nd_gen_get_counts(s)->offered == 1 + 1 + 1 + 12 + 1);

    /* nd_gen_seen: a known example counts as a duplicate */
    nd_pj_doc *old;
    const char old_line[] = "{\"query\":\"Timer 3\",\"answers\":[{\"name\":\"set_timer\","
                            "\"arguments\":{\"minutes\":3}}]}";
    CHECK(nd_pj_parse(old_line, sizeof old_line - 1, &old, NULL) == 0);
    nd_gen_seen(s, nd_pj_root(old));
    nd_pj_free(old);
    size_t dup = nd_gen_get_counts(s)->duplicate;
    CHECK(add(s, "[{\"query\":\"timer 3\",\"answers\":[{\"name\":\"set_timer\","
                 "\"arguments\":{\"minutes\":3}}]}]") == 0);
    CHECK(nd_gen_get_counts(s)->duplicate == dup + 1);
    nd_gen_set_free(s);

    /* tools must be an array */
    nd_pj_doc *obj;
    CHECK(nd_pj_parse("{}", 2, &obj, NULL) == 0);
    CHECK(nd_gen_set_new(nd_pj_root(obj), &s) != 0 && s == NULL);
    nd_pj_free(obj);
    nd_pj_free(doc);
    test_redaction();
    test_reply_envelope();
    test_reply_not_json();
    return tu_finish("test_gen_examples");
}

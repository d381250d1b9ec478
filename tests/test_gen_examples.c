/* gen/examples.c: reply parsing (bare, fenced, wrapped in prose, broken),
 * schema gate per answer, rendering gate, de-duplication and the counts. */
#include <stdlib.h>
#include <string.h>

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
    CHECK(add(s, "[{\"query\":\"x\",\"answers\":[") == 0);
    CHECK(nd_gen_get_counts(s)->unparsable == 2);

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
    return tu_finish("test_gen_examples");
}

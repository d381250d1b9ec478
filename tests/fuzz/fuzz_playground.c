/* libFuzzer target: the playground's request checks without a socket
 * (src/cli/playground/request_check.c): the Host / Origin / Content-Type
 * gates, the --allow-origin parser, the /complete and /finetune body
 * parsers (tools normalisation included) and the grammar-warning
 * classifier, with the properties the server relies on checked (abort on
 * a violation).
 *
 * Input: one selector byte (mod 7), then the text:
 *   0 Host header   1 Origin header   2 Content-Type   3 /complete body
 *   4 /finetune body   5 "--host\n--allow-origin\n..." lines
 *   6 a grammar warning line */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/playground/request_check.h"

static struct pg_access loop_acc, wild_acc;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const char *const allow[] = {"https://play.example.org", "http://box.lan:8080/"};
    char why[256];
    if (pg_access_init(&loop_acc, "127.0.0.1", 7860, allow, 2, why, sizeof why) ||
        pg_access_init(&wild_acc, "::", 80, NULL, 0, why, sizeof why)) {
        fprintf(stderr, "fuzz_playground: %s\n", why);
        abort();
    }
    return 0;
}

static void require(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_playground: property broken: %s\n", what);
        abort();
    }
}

static int starts_ci(const char *s, const char *prefix)
{
    for (; *prefix; s++, prefix++) {
        int c = *s >= 'A' && *s <= 'Z' ? *s + 32 : *s;
        if (c != *prefix)
            return 0;
    }
    return 1;
}

static void check_complete(const char *text, size_t n)
{
    char why[512];
    struct pg_complete_req r;
    if (pg_parse_complete(text, n, &r, why, sizeof why)) {
        require(why[0] != 0, "a refused /complete body says why");
        require(r.tools == NULL && r.query == NULL, "a refused body leaves nothing allocated");
        return;
    }
    json_t *tools = json_loads(r.tools, 0, NULL);
    require(json_is_array(tools), "accepted tools are a JSON array");
    require(r.query != NULL, "an accepted body has a query");
    json_decref(tools);
    pg_complete_req_free(&r);
}

static void check_finetune(const char *text, size_t n)
{
    char why[512];
    struct pg_finetune_req r;
    int code = pg_parse_finetune(text, n, &r, why, sizeof why);
    if (code) {
        require(code == 400 || code == 500, "a refusal is 400 or 500");
        require(!r.jsonl && !r.tools && !r.api_key, "a refused body leaves nothing allocated");
        return;
    }
    /* 0 for epochs, batch_size and lr: not given, the base's recommended
     * setting applies (pg_job_start) */
    require(r.epochs >= 0 && r.epochs <= 1000, "epochs in range");
    require(r.batch_size >= 0 && r.batch_size <= 4096, "batch_size in range");
    require(r.max_len >= 16 && r.max_len <= 65536, "max_len in range");
    require(r.lr >= 0 && r.lr < 10, "lr in range");
    if (!r.jsonl) {
        json_t *tools = json_loads(r.tools ? r.tools : "", 0, NULL);
        require(json_array_size(tools) > 0, "the generate flow has tools");
        require(r.api_key && r.api_key[0], "the generate flow has a key");
        require(r.samples >= 1 && r.samples <= 100000, "samples in range");
        json_decref(tools);
    }
    pg_finetune_req_free(&r);
}

static void check_config(char *text)
{
    const char *lines[17];
    size_t n = 0;
    char *p = text;
    while (n < 17) {
        lines[n++] = p;
        char *e = strchr(p, '\n');
        if (!e)
            break;
        *e = 0;
        p = e + 1;
    }
    struct pg_access a;
    char why[512];
    if (pg_access_init(&a, lines[0], 7860, lines + 1, n - 1, why, sizeof why)) {
        require(why[0] != 0, "a refused configuration says why");
        return;
    }
    /* every origin it lists is accepted, and names a host it answers */
    for (size_t i = 0; i < a.n_origins; i++) {
        require(pg_origin_ok(&a, a.origins[i]), "a listed origin is accepted");
        const char *hp = strstr(a.origins[i], "://");
        require(hp && pg_host_ok(&a, hp + 3), "a listed origin's host is answered");
    }
    pg_origin_ok(&a, "null");
    pg_host_ok(&a, lines[0]);
    pg_access_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 16))
        return 0;
    size_t n = size - 1;
    char *text = malloc(n + 1);
    if (!text)
        return 0;
    memcpy(text, data + 1, n);
    text[n] = 0; /* headers are C strings: an embedded NUL ends them */
    switch (data[0] % 7) {
    case 0: {
        int ok = pg_host_ok(&loop_acc, text);
        require(!ok || starts_ci(text, "localhost:7860") || starts_ci(text, "127.0.0.1:7860") ||
                    starts_ci(text, "[::1]:7860") || starts_ci(text, "play.example.org") ||
                    starts_ci(text, "box.lan:8080"),
                "a loopback server answers only its own names");
        require(!ok || strlen(text) < 300, "no overlong Host is answered");
        pg_host_ok(&wild_acc, text);
        break;
    }
    case 1: {
        int ok = pg_origin_ok(&loop_acc, text);
        require(!ok || starts_ci(text, "http://localhost:7860") ||
                    starts_ci(text, "http://127.0.0.1:7860") ||
                    starts_ci(text, "http://[::1]:7860") ||
                    starts_ci(text, "https://play.example.org") ||
                    starts_ci(text, "http://box.lan:8080"),
                "a loopback server takes POSTs only from its own origins");
        require(!ok || strcmp(text, "null"), "the opaque origin is never trusted");
        pg_origin_ok(&wild_acc, text);
        break;
    }
    case 2: {
        int json = pg_media_type_is(text, "application/json");
        require(!json || starts_ci(text + strspn(text, " \t"), "application/json"),
                "only application/json is JSON");
        require(!pg_media_type_is(text, "application/octet-stream") || !json,
                "one media type at a time");
        break;
    }
    case 3: check_complete((const char *)data + 1, n); break;
    case 4: check_finetune((const char *)data + 1, n); break;
    case 5: check_config(text); break;
    default: pg_warning_unsatisfiable(text); break;
    }
    free(text);
    return 0;
}

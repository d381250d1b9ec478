/* Request scheduling of data generation (generate.h). */
#include "net/generate.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* {"model", "messages": [system, user], "temperature"} */
static char *request_body(const nd_generate_opts *o, const nd_pj *tools)
{
    nd_buf user = {0};
    if (nd_gen_user_prompt(tools, o->batch_size, o->refusals, &user)) {
        nd_buf_free(&user);
        return NULL;
    }
    json_t *body = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s}], s:f}", "model", o->model,
                             "messages", "role", "system", "content", nd_gen_system_prompt, "role",
                             "user", "content", user.p, "temperature", o->temperature);
    nd_buf_free(&user);
    if (!body)
        return NULL;
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return text;
}

int nd_generate(const nd_generate_opts *o, const nd_pj *tools, nd_gen_set *set,
                nd_generate_stats *st)
{
    memset(st, 0, sizeof *st);
    if (o->num_samples < 1 || o->batch_size < 1)
        return nd_error(ND_EARG, "--num-samples and --batch-size must be at least 1");
    char *body = request_body(o, tools);
    if (!body)
        return nd_error(ND_ENOMEM, "cannot build the request (is the model name valid UTF-8?)");
    size_t body_len = strlen(body);
    nd_chat *chat;
    int rc = nd_chat_new(&o->chat, &chat);
    if (rc) {
        free(body);
        return rc;
    }
    /* upstream: aim 30% over, give up after 3x the batches that needs */
    long target = (long)((double)o->num_samples * 1.3);
    long max_submissions = target / o->batch_size * 3;
    if (max_submissions < 1)
        max_submissions = 1;
    long first = (target + o->batch_size - 1) / o->batch_size;
    if (first < 1)
        first = 1;
    if (first > o->chat.max_active)
        first = o->chat.max_active;
    size_t want = (size_t)o->num_samples;
    for (long i = 0; i < first && !rc; i++, st->submitted++)
        rc = nd_chat_submit(chat, body, body_len, NULL);
    nd_chat_result res;
    while (!rc && nd_gen_size(set) < want) {
        int got = nd_chat_wait(chat, &res);
        if (got <= 0) {
            rc = got;
            break;
        }
        if (res.ok)
            nd_gen_add_reply(set, res.content, res.content_len, want);
        else if (!st->failed++)
            snprintf(st->first_error, sizeof st->first_error, "%s", res.err);
        free(res.content);
        if (o->progress) {
            if (!res.ok)
                fprintf(o->progress, "  %-9s %s\n", "failed", res.err);
            size_t done = nd_gen_size(set);
            fprintf(o->progress, "  %-9s %zu/%ld  failed %d\n", "generated",
                    done < want ? done : want, o->num_samples, st->failed);
            fflush(o->progress);
        }
        if (nd_gen_size(set) < want && st->submitted < max_submissions) {
            rc = nd_chat_submit(chat, body, body_len, NULL);
            st->submitted++;
        }
    }
    nd_chat_free(chat); /* abandons what is still in flight, as upstream */
    free(body);
    return rc;
}

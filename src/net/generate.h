/* Generate examples for a set of tools from an OpenAI-compatible chat
 * service, as upstream's generate_dataset: batches of `batch_size`
 * examples per request, `workers` requests in flight, requests continue
 * until `num_samples` examples are kept or 3x the batches for 1.3x the
 * samples have been sent (then fewer examples come back). */
#ifndef ND_NET_GENERATE_H
#define ND_NET_GENERATE_H

#include <stdio.h>

#include "gen/examples.h"
#include "net/chat_client.h"

typedef struct {
    nd_chat_opts chat; /* url, api_key, max_active = workers, retries ... */
    const char *model;
    double temperature;
    long num_samples;
    int batch_size;
    int refusals;   /* off-topic examples asked for per request (upstream: 3) */
    FILE *progress; /* a line per finished request; NULL = quiet */
} nd_generate_opts;

typedef struct {
    int submitted, failed;
    char first_error[320]; /* the first failed request's message (redacted), "" if none */
} nd_generate_stats;

/* Fill `set` (made for the same tools) with up to num_samples examples. */
int nd_generate(const nd_generate_opts *o, const nd_pj *tools, nd_gen_set *set,
                nd_generate_stats *st);

#endif

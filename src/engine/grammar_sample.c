/* Random call lists a compiled grammar accepts (see grammar.h,
 * nd_gram_sample): a walk over the automaton's accepted bytes that uses
 * only the public runtime (feed, dist, done), so what it prints is exactly
 * what the decoder may let the model write. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/grammar.h"

/* bytes at most per sample before the walk is declared stuck */
#define SAMPLE_MAX_BYTES (1 << 20)

int nd_gram_sample(const nd_grammar *g, nd_rng *r, int soft_len, nd_buf *out)
{
    nd_gram_state s, n;
    nd_gram_init(g, &s);
    unsigned char ok[256];
    int dist[256];
    size_t start = out->n;
    int len = 0;
    if (soft_len < 0)
        soft_len = 0;
    while (!nd_gram_done(&s)) {
        if (len >= SAMPLE_MAX_BYTES)
            return nd_error(ND_EFORMAT,
                            "grammar sample: no closed call list after %d bytes (the walk "
                            "towards the shortest completion does not end): %.200s",
                            len, out->p + start);
        int nok = 0, best = 1 << 30;
        for (int c = 0; c < 256; c++) {
            nd_gram_copy(&n, &s);
            if (!nd_gram_feed(g, &n, (unsigned char)c))
                continue;
            ok[nok] = (unsigned char)c;
            dist[nok] = nd_gram_dist(g, &n);
            best = dist[nok] < best ? dist[nok] : best;
            nok++;
        }
        if (!nok)
            return nd_error(ND_EFORMAT,
                            "grammar sample: dead end after %d bytes (no byte is accepted and "
                            "the call list is not closed): %.200s",
                            len, out->p + start);
        int pick = -1;
        /* free choice while short, with a pull towards closing (a string
         * ends, an object closes) so values stay small; past soft_len only
         * the bytes on a shortest way to the end */
        /* the first call: rarely the empty list */
        for (int i = 0; i < nok && len == 1 && pick < 0; i++)
            if (ok[i] == '{' && nd_rng_uniform(r) < 0.95)
                pick = i;
        if (pick >= 0) {
        } else if (len < soft_len && nd_rng_uniform(r) >= 0.2) {
            pick = (int)nd_rng_below(r, (uint64_t)nok);
        } else {
            int nbest = 0;
            for (int i = 0; i < nok; i++)
                if (dist[i] == best)
                    nbest++;
            int k = (int)nd_rng_below(r, (uint64_t)nbest);
            for (int i = 0; i < nok && pick < 0; i++)
                if (dist[i] == best && k-- == 0)
                    pick = i;
        }
        char b = (char)ok[pick];
        if (!nd_gram_feed(g, &s, ok[pick]))
            return nd_error(ND_EFORMAT, "grammar sample: an accepted byte was refused");
        int rc = nd_buf_put(out, &b, 1);
        if (rc)
            return rc;
        len++;
    }
    return ND_OK;
}

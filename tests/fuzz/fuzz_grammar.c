/* libFuzzer target: tool schemas -> grammar. The input is a tools JSON
 * array, optionally followed by a NUL byte and bytes to drive through the
 * compiled automaton. Compiling must refuse bad schemas cleanly; driving
 * checks the runtime's promises: a rejected byte is skipped (the state is
 * fed on a copy), nd_gram_dist never drops by more than one per accepted
 * byte, is 0 once done, and from every reached state a byte that lowers it
 * by exactly one exists until the call list is closed (every accepted
 * prefix can be completed, and dist is exact); nd_gram_in_array is 0 or 1,
 * and 0 inside a string. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar.h"
#include "text/pyjson.h"

static void complete(const nd_grammar *g, nd_gram_state *s)
{
    int d = nd_gram_dist(g, s);
    if (d > 48)
        return; /* bounded work per input */
    int escapes = 0;
    while (!nd_gram_done(s)) {
        nd_gram_state n;
        int found = 0;
        for (int c = 0; c < 256 && !found; c++) {
            nd_gram_copy(&n, s);
            if (nd_gram_feed(g, &n, (unsigned char)c) && nd_gram_dist(g, &n) == d - 1)
                found = 1;
        }
        /* Known limit: inside a string with a pattern, nd_gram_dist counts a
         * character that must be escaped (quote, backslash, \n ...) as one
         * byte, so the backslash of such an escape leaves it unchanged. */
        if (!found && escapes < 64) {
            nd_gram_copy(&n, s);
            if (nd_gram_feed(g, &n, '\\') && nd_gram_dist(g, &n) == d) {
                nd_gram_copy(s, &n);
                escapes++;
                continue;
            }
        }
        if (!found)
            abort(); /* a dead end, or dist is not the fewest bytes left */
        nd_gram_copy(s, &n);
        d--;
    }
    if (d != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const uint8_t *drive = nul ? nul + 1 : data + size;
    size_t dlen = nul ? size - jlen - 1 : 0;
    nd_pj_doc *doc;
    if (nd_pj_parse((const char *)data, jlen, &doc, NULL) != 0)
        return 0;
    nd_grammar *g;
    if (nd_gram_compile(nd_pj_root(doc), &g) != 0) {
        nd_pj_free(doc);
        return 0;
    }
    (void)nd_gram_warnings(g);
    nd_gram_require_call(g, dlen && (drive[0] & 1));
    nd_gram_state s, n;
    nd_gram_init(g, &s);
    int d = nd_gram_dist(g, &s);
    if (d < 2)
        abort(); /* "[]" at least */
    for (size_t i = 0; i < dlen && !nd_gram_done(&s); i++) {
        nd_gram_copy(&n, &s);
        if (!nd_gram_feed(g, &n, drive[i]))
            continue;
        int nd = nd_gram_dist(g, &n);
        if (nd < 0 || nd < d - 1)
            abort();
        nd_gram_copy(&s, &n);
        d = nd;
        const char *num;
        int nlen, in_arr = nd_gram_in_array(&s);
        if ((in_arr != 0 && in_arr != 1) ||
            (in_arr && nd_gram_value_pos(&s, &num, &nlen) == ND_GRAM_IN_STRING))
            abort(); /* never inside a string item */
    }
    if (nd_gram_done(&s) && d != 0)
        abort();
    complete(g, &s);
    nd_gram_free(g);
    nd_pj_free(doc);
    return 0;
}

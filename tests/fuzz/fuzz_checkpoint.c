/* libFuzzer target: a pickle as a checkpoint. ckpt_from_tree must refuse
 * anything that is not a consistent format-v2 checkpoint without crashing,
 * leaking or allocating what the config claims before the arrays back it;
 * whatever loads must write back (ckpt_to_tree, carrying the extras) and
 * load again to the same weights, and saving that again must give the same
 * bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pv *root = NULL;
    if (pickle_loads(data, size, "fuzz", &root) != 0)
        return 0;
    san_model m;
    if (ckpt_from_tree(root, "fuzz", &m) == 0) {
        pv *tree = ckpt_to_tree(&m, root);
        unsigned char *buf = NULL;
        size_t len = 0;
        pv *again = NULL;
        san_model m2;
        if (!tree || pickle_dumps(tree, &buf, &len) != 0 ||
            pickle_loads(buf, len, "fuzz-rt", &again) != 0 ||
            ckpt_from_tree(again, "fuzz-rt", &m2) != 0)
            abort(); /* what loads must save and load again */
        if (m2.numel != m.numel || memcmp(m2.mem, m.mem, m.numel * sizeof(float)) != 0)
            abort();
        /* saving what was saved changes nothing: extras are carried whole.
         * Compared as freshly loaded trees, dumped: the writer memoizes
         * values by reference count, which outside holders change. */
        unsigned char *da = NULL, *buf2 = NULL, *db = NULL;
        size_t la = 0, len2 = 0, lb = 0;
        if (pickle_dumps(again, &da, &la) != 0)
            abort();
        pv *tree2 = ckpt_to_tree(&m2, again), *again2 = NULL;
        if (!tree2 || pickle_dumps(tree2, &buf2, &len2) != 0)
            abort();
        pv_decref(tree2);
        if (pickle_loads(buf2, len2, "fuzz-rt2", &again2) != 0 ||
            pickle_dumps(again2, &db, &lb) != 0 || la != lb || memcmp(da, db, la) != 0)
            abort();
        pv_decref(again2);
        free(da);
        free(db);
        free(buf2);
        san_model_free(&m2);
        pv_decref(again);
        free(buf);
        pv_decref(tree);
        san_model_free(&m);
    }
    pv_decref(root);
    return 0;
}

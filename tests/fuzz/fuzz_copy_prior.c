/* libFuzzer target: a user's turn as the copy prior reads it
 * (engine/copy_prior.h). The text up to the first NUL goes through
 * nd_copy_numbers_as_digits: the result is never longer than the text,
 * holds no NUL, and a second pass leaves it as it is (digits stay digits).
 * The bytes after the NUL, as a NEEDLE_COPY_PRIOR value: accepted ones
 * are in range. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/copy_prior.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    size_t len = strlen(text);

    nd_buf once = {0}, twice = {0};
    if (nd_copy_numbers_as_digits(text, &once) == 0) {
        const char *o = once.p ? once.p : "";
        if (once.n > len || strlen(o) != once.n)
            abort();
        if (nd_copy_numbers_as_digits(o, &twice) == 0 &&
            (twice.n != once.n || (once.n && memcmp(twice.p, once.p, once.n))))
            abort();
    }
    nd_buf_free(&once);
    nd_buf_free(&twice);

    if (len < size) {
        char setting[64];
        size_t n = size - len - 1 < sizeof setting - 1 ? size - len - 1 : sizeof setting - 1;
        memcpy(setting, text + len + 1, n);
        setting[n] = 0;
        float b[ND_COPY_N_BONUS];
        if (nd_copy_prior_setting(setting, b) == 0)
            for (int i = 0; i < ND_COPY_N_BONUS; i++)
                if (!(b[i] >= 0.0f && b[i] <= 100.0f))
                    abort();
    }
    free(text);
    return 0;
}

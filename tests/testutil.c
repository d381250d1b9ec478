#include "testutil.h"

#include <math.h>

int tu_failures, tu_checks;

double tu_rel_err(const float *a, const float *b, long n, double floor)
{
    double md = 0, mb = floor;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md))
            md = d; /* NaN propagates as a huge error */
        if (fabs(b[i]) > mb)
            mb = fabs(b[i]);
    }
    return md / mb;
}

int tu_finish(const char *name)
{
    printf("%s: %d checks, %d failures\n", name, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

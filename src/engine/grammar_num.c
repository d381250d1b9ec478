/* Tool-call grammar: number bounds checked on the decimal text. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/grammar_internal.h"

/* ------------------------------------------------------------------ */
/* numbers                                                             */

static const int64_t P10[19] = {1,
                                10,
                                100,
                                1000,
                                10000,
                                100000,
                                1000000,
                                10000000,
                                100000000,
                                1000000000,
                                10000000000,
                                100000000000,
                                1000000000000,
                                10000000000000,
                                100000000000000,
                                1000000000000000,
                                10000000000000000,
                                100000000000000000,
                                1000000000000000000};

/* K * 10^-ft as the double a JSON parser reads from its decimal text, so
 * bound checks agree with any validator comparing parsed floats */
static double decimal_value(int64_t K, int ft)
{
    char buf[48];
    int n = snprintf(buf, sizeof buf, "%0*lld", ft + 1, (long long)K);
    if (ft > 0) {
        memmove(buf + n - ft + 1, buf + n - ft, (size_t)ft + 1);
        buf[n - ft] = '.';
    }
    return strtod(buf, NULL);
}

typedef struct {
    double lo, hi;
    int lo_ex, hi_ex;
} mag_bounds;

static int ok_lo(const mag_bounds *b, double m)
{
    return b->lo_ex ? m > b->lo : m >= b->lo;
}

static int ok_hi(const mag_bounds *b, double m)
{
    return b->hi_ex ? m < b->hi : m <= b->hi;
}

/* some K in [Klo, Khi] (units of 10^-ft) within the magnitude bounds? */
static int range_feasible(const mag_bounds *b, int64_t Klo, int64_t Khi, int ft)
{
    int64_t K = Klo;
    if (!ok_lo(b, decimal_value(Klo, ft))) {
        double x = ceil(b->lo * (double)P10[ft]);
        if (x > (double)Khi + 1)
            return 0;
        K = x < (double)Klo ? Klo : (int64_t)x;
        for (int i = 0; i < 4 && K > Klo && ok_lo(b, decimal_value(K - 1, ft)); i++)
            K--;
        for (int i = 0; i < 4 && K <= Khi && !ok_lo(b, decimal_value(K, ft)); i++)
            K++;
        if (K > Khi || !ok_lo(b, decimal_value(K, ft)))
            return 0;
    }
    return ok_hi(b, decimal_value(K, ft));
}

/* Integer digits a number may have: MAX_DIGITS when the schema bounds it
 * on both sides, else ND_GRAM_FREE_INT_DIGITS, or more when its one bound
 * needs them (minimum 1e14: a cap of 13 would admit nothing). */
static int int_digit_cap(const gnode *n)
{
    if (!isinf(n->lo) && !isinf(n->hi))
        return MAX_DIGITS;
    double b = !isinf(n->lo) ? fabs(n->lo) : !isinf(n->hi) ? fabs(n->hi) : 0;
    int need = 1;
    while (need < MAX_DIGITS && b >= (double)P10[need])
        need++;
    need++; /* a bound's own digits, and room to pass it */
    if (need < ND_GRAM_FREE_INT_DIGITS)
        need = ND_GRAM_FREE_INT_DIGITS;
    return need > MAX_DIGITS ? MAX_DIGITS : need;
}

/* Fewest characters to append to the number prefix t[0..len) so that it
 * becomes a number the node admits (no exponent, <= MAX_DIGITS digits);
 * -1 if none. */
int nd_gram_num_short(const gnode *n, const char *t, int len)
{
    int i = 0, neg = 0;
    if (i < len && t[i] == '-') {
        neg = 1;
        i++;
    }
    int is = i;
    int64_t ival = 0, fval = 0;
    while (i < len && t[i] >= '0' && t[i] <= '9' && i - is < MAX_DIGITS)
        ival = ival * 10 + (t[i++] - '0');
    int ni = i - is, dot = 0, nf = 0;
    if (i < len && t[i] == '.') {
        dot = 1;
        i++;
        while (i < len && t[i] >= '0' && t[i] <= '9' && ni + nf < MAX_DIGITS) {
            fval = fval * 10 + (t[i++] - '0');
            nf++;
        }
    }
    if (i != len)
        return -1;
    mag_bounds b;
    if (!neg)
        b = (mag_bounds){n->lo, n->hi, n->lo_ex, n->hi_ex};
    else
        b = (mag_bounds){-n->hi, -n->lo, n->hi_ex, n->lo_ex};
    if (b.lo < 0 || (b.lo == 0 && !b.lo_ex && neg)) {
        b.lo = 0;
        b.lo_ex = 0;
    }
    int unbounded = isinf(n->lo) && isinf(n->hi);
    int int_cap = int_digit_cap(n);
    int allow_frac = n->kind != K_INT;
    int lead0 = ni > 0 && t[is] == '0';
    for (int L = 0; L <= MAX_DIGITS + 2; L++) {
        for (int e = 0; e <= L; e++) {
            if ((dot || lead0) && e > 0)
                break;
            if (ni + e == 0)
                continue;
            int rem = L - e, ft;
            if (dot)
                ft = nf + rem;
            else if (rem == 0)
                ft = 0;
            else if (rem >= 2 && allow_frac)
                ft = rem - 1;
            else
                continue;
            if (dot && ft < 1)
                continue;
            if (ni + e + ft > MAX_DIGITS || ni + e > int_cap)
                continue;
            if (unbounded)
                return L;
            int64_t Ilo, Ihi;
            if (ni == 0) {
                Ilo = e == 1 ? 0 : P10[e - 1];
                Ihi = P10[e] - 1;
            } else {
                Ilo = ival * P10[e];
                Ihi = Ilo + P10[e] - 1;
            }
            int64_t Klo, Khi;
            if (dot) {
                Klo = ival * P10[ft] + fval * P10[ft - nf];
                Khi = Klo + P10[ft - nf] - 1;
            } else {
                Klo = Ilo * P10[ft];
                Khi = Ihi * P10[ft] + P10[ft] - 1;
            }
            if (range_feasible(&b, Klo, Khi, ft))
                return L;
        }
    }
    return -1;
}

/* Is t[0..len) a syntactically possible number prefix for the node? */
int nd_gram_num_syntax(const gnode *n, const char *t, int len)
{
    int i = 0, digits = 0, run = 0;
    int free_num = isinf(n->lo) || isinf(n->hi);
    if (i < len && t[i] == '-')
        i++;
    int is = i;
    while (i < len && t[i] >= '0' && t[i] <= '9') {
        run = i > is && t[i] == t[i - 1] && t[i] != '0' ? run + 1 : 1;
        if (free_num && run > ND_GRAM_MAX_RUN)
            return 0;
        i++;
        digits++;
    }
    if (i - is > 1 && t[is] == '0')
        return 0;
    if (i - is > int_digit_cap(n))
        return 0;
    if (i < len && t[i] == '.') {
        if (n->kind == K_INT || i == is)
            return 0;
        i++;
        int fs = i;
        while (i < len && t[i] >= '0' && t[i] <= '9') {
            run = i > fs && t[i] == t[i - 1] && t[i] != '0' ? run + 1 : 1;
            if (free_num && run > ND_GRAM_MAX_RUN)
                return 0;
            i++;
            digits++;
        }
    }
    return i == len && digits <= MAX_DIGITS;
}

int nd_gram_num_minlen(const gnode *n)
{
    int a = nd_gram_num_short(n, "", 0), b = nd_gram_num_short(n, "-", 1);
    if (a < 0)
        return b < 0 ? -1 : b + 1;
    return b < 0 || a <= b + 1 ? a : b + 1;
}

#include "engine/regex.h"

#include <string.h>

#include "core/status.h"

#define INF 1000000

typedef struct {
    nd_regex *re;
    const char *p;
    int err;
    int depth; /* group nesting: anchors are only understood at depth 0 */
} parser;

typedef struct {
    int s, a;
} frag;

static int new_state(parser *ps)
{
    nd_regex *re = ps->re;
    if (re->n >= ND_RE_MAX_STATES) {
        if (!ps->err)
            ps->err =
                nd_error(ND_ELIMIT, "pattern needs more than %d NFA states", ND_RE_MAX_STATES);
        return 0;
    }
    int i = re->n++;
    re->st[i].eps[0] = re->st[i].eps[1] = re->st[i].next = -1;
    re->st[i].cls[0] = re->st[i].cls[1] = 0;
    return i;
}

static void add_eps(parser *ps, int from, int to)
{
    nd_regex *re = ps->re;
    if (re->st[from].eps[0] < 0)
        re->st[from].eps[0] = to;
    else if (re->st[from].eps[1] < 0)
        re->st[from].eps[1] = to;
    else if (!ps->err)
        ps->err = nd_error(ND_EUNSUPPORTED, "internal: NFA state with three epsilon edges");
}

static void cls_set(uint64_t c[2], int ch)
{
    if (ch >= 0 && ch < 128)
        c[ch >> 6] |= 1ull << (ch & 63);
}

static void cls_range(uint64_t c[2], int a, int b)
{
    for (int ch = a; ch <= b; ch++)
        cls_set(c, ch);
}

/* \d \w \s and their negations into c; 0 if `e` is not a class escape */
static int class_escape(int e, uint64_t c[2])
{
    uint64_t t[2] = {0, 0};
    switch (e | 0x20) {
    case 'd': cls_range(t, '0', '9'); break;
    case 'w':
        cls_range(t, '0', '9');
        cls_range(t, 'a', 'z');
        cls_range(t, 'A', 'Z');
        cls_set(t, '_');
        break;
    case 's':
        cls_set(t, ' ');
        cls_range(t, '\t', '\r');
        break;
    default: return 0;
    }
    if (e >= 'A' && e <= 'Z') {
        t[0] = ~t[0];
        t[1] = ~t[1];
    }
    c[0] |= t[0];
    c[1] |= t[1];
    return 1;
}

/* the character an escape \e stands for; -1 for an escape this engine
 * does not support: any other letter or digit (back-references \1 \k<n>,
 * word boundaries \b \B, \u \x \p \c ...), so that none of them is read
 * as a literal letter */
static int escape_char(int e)
{
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9') || e >= 128)
            return -1;
        return e;
    }
}

static frag char_frag(parser *ps, const uint64_t c[2])
{
    int s = new_state(ps), a = new_state(ps);
    ps->re->st[s].next = a;
    ps->re->st[s].cls[0] = c[0];
    ps->re->st[s].cls[1] = c[1];
    return (frag){s, a};
}

static frag parse_alt(parser *ps);

/* ( ... ): a plain group, (?:...), or a named group (?<name>...) /
 * (?P<name>...) read as a plain one; lookaround, flags and the rest are
 * refused rather than read as the literal text they start with. ps->p is
 * at the '('. */
static frag parse_group(parser *ps)
{
    uint64_t c[2] = {0, 0};
    ps->p++;
    if (ps->p[0] == '?') {
        const char *q = ps->p + 1;
        if (*q == 'P')
            q++;
        if (ps->p[1] == ':') {
            ps->p += 2;
        } else if (*q == '<' && q[1] != '=' && q[1] != '!') {
            const char *e = strchr(q, '>');
            if (!e) {
                if (!ps->err)
                    ps->err = nd_error(ND_EUNSUPPORTED, "unterminated group name in pattern");
                return char_frag(ps, c);
            }
            ps->p = e + 1;
        } else {
            const char *what = ps->p[1] == '=' || ps->p[1] == '!' ? "lookahead"
                               : ps->p[1] == '<'                  ? "lookbehind"
                                                                  : "group construct";
            if (!ps->err)
                ps->err = nd_error(ND_EUNSUPPORTED,
                                   "%s '(%.3s' is not supported (a grammar cannot express it)",
                                   what, ps->p);
            return char_frag(ps, c);
        }
    }
    ps->depth++;
    frag f = parse_alt(ps);
    ps->depth--;
    if (*ps->p != ')') {
        if (!ps->err)
            ps->err = nd_error(ND_EUNSUPPORTED, "unbalanced '(' in pattern");
        return f;
    }
    ps->p++;
    return f;
}

/* [...]: a class of ASCII characters, ranges and class escapes, negated
 * by a leading ^; a ']' first is a member. ps->p is at the '['. */
static frag parse_class(parser *ps)
{
    uint64_t c[2] = {0, 0};
    ps->p++;
    int neg = 0;
    if (*ps->p == '^') {
        neg = 1;
        ps->p++;
    }
    int first = 1;
    while (*ps->p && (*ps->p != ']' || first)) {
        first = 0;
        int lo = (unsigned char)*ps->p++;
        if (lo >= 128) {
            if (!ps->err)
                ps->err = nd_error(ND_EUNSUPPORTED, "non-ASCII characters in a pattern are "
                                                    "not supported");
            return char_frag(ps, c);
        }
        if (lo == '\\') {
            int e = (unsigned char)*ps->p;
            if (!e)
                break;
            ps->p++;
            if (class_escape(e, c))
                continue;
            lo = e == 'b' ? '\b' : escape_char(e); /* [\b] is a backspace */
            if (lo < 0) {
                if (!ps->err)
                    ps->err = nd_error(ND_EUNSUPPORTED, "pattern escape \\%c is not supported", e);
                return char_frag(ps, c);
            }
        }
        if (ps->p[0] == '-' && ps->p[1] && ps->p[1] != ']') {
            int hi = (unsigned char)ps->p[1];
            ps->p += 2;
            if (hi == '\\' && *ps->p)
                hi = escape_char((unsigned char)*ps->p++);
            if (hi < 0 || hi >= 128) {
                if (!ps->err)
                    ps->err =
                        nd_error(ND_EUNSUPPORTED, "range end in a pattern class is not supported");
                return char_frag(ps, c);
            }
            if (hi < lo) {
                if (!ps->err)
                    ps->err = nd_error(ND_EUNSUPPORTED, "bad range %c-%c in pattern", lo, hi);
                return char_frag(ps, c);
            }
            cls_range(c, lo, hi > 127 ? 127 : hi);
        } else {
            cls_set(c, lo);
        }
    }
    if (*ps->p != ']') {
        if (!ps->err)
            ps->err = nd_error(ND_EUNSUPPORTED, "unterminated '[' in pattern");
    } else {
        ps->p++;
    }
    if (neg) {
        c[0] = ~c[0];
        c[1] = ~c[1];
    }
    return char_frag(ps, c);
}

/* \x outside a class: a class escape (\d \w \s and negations) or the
 * character it stands for; back-references, word boundaries and other
 * letter escapes are refused. ps->p is at the backslash. */
static frag parse_escape(parser *ps)
{
    uint64_t c[2] = {0, 0};
    ps->p++;
    int e = (unsigned char)*ps->p;
    if (!e) {
        if (!ps->err)
            ps->err = nd_error(ND_EUNSUPPORTED, "pattern ends with a backslash");
        return char_frag(ps, c);
    }
    ps->p++;
    if (!class_escape(e, c)) {
        int x = escape_char(e);
        if (x < 0) {
            if (!ps->err)
                ps->err = nd_error(ND_EUNSUPPORTED, "pattern escape \\%c is not supported%s", e,
                                   e >= '1' && e <= '9'   ? " (a back-reference)"
                                   : e == 'b' || e == 'B' ? " (a word boundary)"
                                                          : "");
            return char_frag(ps, c);
        }
        cls_set(c, x);
    }
    return char_frag(ps, c);
}

static frag parse_atom(parser *ps)
{
    uint64_t c[2] = {0, 0};
    int ch = (unsigned char)*ps->p;
    if (ch == '(')
        return parse_group(ps);
    if (ch == '[')
        return parse_class(ps);
    if (ch == '\\')
        return parse_escape(ps);
    if (ch == '.') { /* any character but a line break, as Python and ECMA-262 */
        ps->p++;
        c[0] = ~0ull & ~(1ull << '\n') & ~(1ull << '\r');
        c[1] = ~0ull;
        return char_frag(ps, c);
    }
    if (ch == '^' || ch == '$') {
        if (!ps->err)
            ps->err = nd_error(ND_EUNSUPPORTED,
                               "anchor '%c' inside a pattern is not supported (only ^ at the "
                               "start and $ at the end)",
                               ch);
        ps->p++;
        return char_frag(ps, c);
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '|' || ch == ')') {
        /* a quantifier with nothing to repeat (parse_concat stops at | and ) ) */
        if (!ps->err)
            ps->err = nd_error(ND_EUNSUPPORTED, "'%c' with nothing to repeat in pattern", ch);
        ps->p++;
        return char_frag(ps, c);
    }
    if (ch >= 128) {
        if (!ps->err)
            ps->err = nd_error(ND_EUNSUPPORTED, "non-ASCII characters in a pattern are not "
                                                "supported");
        ps->p++;
        return char_frag(ps, c);
    }
    ps->p++;
    cls_set(c, ch);
    return char_frag(ps, c);
}

static frag concat(parser *ps, frag a, frag b)
{
    add_eps(ps, a.a, b.s);
    return (frag){a.s, b.a};
}

static frag empty_frag(parser *ps)
{
    int s = new_state(ps), a = new_state(ps);
    add_eps(ps, s, a);
    return (frag){s, a};
}

static frag star(parser *ps, frag f)
{
    int s = new_state(ps), a = new_state(ps);
    add_eps(ps, s, f.s);
    add_eps(ps, s, a);
    add_eps(ps, f.a, f.s);
    add_eps(ps, f.a, a);
    return (frag){s, a};
}

static frag opt(parser *ps, frag f)
{
    int s = new_state(ps), a = new_state(ps);
    add_eps(ps, s, f.s);
    add_eps(ps, s, a);
    add_eps(ps, f.a, a);
    return (frag){s, a};
}

static int parse_count(parser *ps, int *out)
{
    int v = 0, any = 0;
    while (*ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > 1000)
            v = 1000;
        any = 1;
    }
    *out = v;
    return any;
}

static frag parse_repeat(parser *ps)
{
    const char *atom_start = ps->p;
    frag f = parse_atom(ps);
    const char *atom_end = ps->p;
    for (;;) {
        char q = *ps->p;
        if (q == '*') {
            ps->p++;
            f = star(ps, f);
        } else if (q == '+') {
            ps->p++;
            /* one copy, then a star of a fresh copy */
            const char *save = ps->p;
            ps->p = atom_start;
            frag g = parse_atom(ps);
            ps->p = save;
            f = concat(ps, f, star(ps, g));
        } else if (q == '?') {
            ps->p++;
            f = opt(ps, f);
        } else if (q == '{') {
            const char *save = ps->p;
            ps->p++;
            int m = 0, n = 0, has_n = 1;
            if (!parse_count(ps, &m)) {
                ps->p = save; /* literal '{' */
                break;
            }
            n = m;
            if (*ps->p == ',') {
                ps->p++;
                has_n = parse_count(ps, &n);
            }
            if (*ps->p != '}' || (has_n && n < m)) {
                if (!ps->err)
                    ps->err = nd_error(ND_EUNSUPPORTED, "bad {m,n} quantifier in pattern");
                return f;
            }
            ps->p++;
            const char *after = ps->p;
            /* f already is copy 1 (when m >= 1); build the rest by re-parsing */
            frag acc = m >= 1 ? f : empty_frag(ps);
            for (int i = 1; i < m && !ps->err; i++) {
                ps->p = atom_start;
                frag g = parse_atom(ps);
                acc = concat(ps, acc, g);
            }
            if (!has_n) {
                ps->p = atom_start;
                frag g = parse_atom(ps);
                acc = concat(ps, acc, star(ps, g));
            } else {
                for (int i = m; i < n && !ps->err; i++) {
                    ps->p = atom_start;
                    frag g = parse_atom(ps);
                    if (i == 0 && m == 0)
                        acc = opt(ps, g);
                    else
                        acc = concat(ps, acc, opt(ps, g));
                }
            }
            ps->p = after;
            (void)atom_end;
            f = acc;
        } else {
            break;
        }
        if (ps->err)
            break;
    }
    return f;
}

static frag any_star(parser *ps)
{
    uint64_t any[2] = {~0ull, ~0ull};
    return star(ps, char_frag(ps, any));
}

/* One branch of an alternation. At the top level each branch has its own
 * anchors, as in ^a|b$ = (^a)|(b$); a branch without ^ may start anywhere
 * in the string, one without $ may end anywhere. */
static frag parse_concat(parser *ps)
{
    int top = ps->depth == 0, anch_s = 0, anch_e = 0;
    if (top && *ps->p == '^') {
        anch_s = 1;
        ps->p++;
    }
    frag f = empty_frag(ps);
    while (*ps->p && *ps->p != '|' && *ps->p != ')' && !ps->err) {
        if (top && *ps->p == '$' && (ps->p[1] == 0 || ps->p[1] == '|')) {
            anch_e = 1;
            ps->p++;
            break;
        }
        f = concat(ps, f, parse_repeat(ps));
    }
    if (top && !ps->err) {
        if (!anch_s)
            f = concat(ps, any_star(ps), f);
        if (!anch_e)
            f = concat(ps, f, any_star(ps));
    }
    return f;
}

static frag parse_alt(parser *ps)
{
    frag f = parse_concat(ps);
    while (*ps->p == '|' && !ps->err) {
        ps->p++;
        frag g = parse_concat(ps);
        int s = new_state(ps), a = new_state(ps);
        add_eps(ps, s, f.s);
        add_eps(ps, s, g.s);
        add_eps(ps, f.a, a);
        add_eps(ps, g.a, a);
        f = (frag){s, a};
    }
    return f;
}

static void set_add(nd_re_set *s, int i)
{
    s->w[i >> 6] |= 1ull << (i & 63);
}

static void set_or(nd_re_set *dst, const nd_re_set *src)
{
    for (int w = 0; w < ND_RE_WORDS; w++)
        dst->w[w] |= src->w[w];
}

static int set_has(const nd_re_set *s, int i)
{
    return (int)((s->w[i >> 6] >> (i & 63)) & 1);
}

static void closure_of(const nd_regex *re, int i, nd_re_set *out)
{
    int stack[ND_RE_MAX_STATES * 2], sp = 0;
    stack[sp++] = i;
    while (sp) {
        int s = stack[--sp];
        if (set_has(out, s))
            continue;
        set_add(out, s);
        for (int k = 0; k < 2; k++)
            if (re->st[s].eps[k] >= 0 && sp < ND_RE_MAX_STATES * 2)
                stack[sp++] = re->st[s].eps[k];
    }
}

int nd_re_compile(const char *pattern, nd_regex *re)
{
    memset(re, 0, sizeof *re);
    parser ps = {re, pattern, 0, 0};
    frag f = parse_alt(&ps);
    if (!ps.err && *ps.p)
        ps.err = nd_error(ND_EUNSUPPORTED, "unexpected '%c' in pattern", *ps.p);
    if (ps.err)
        return ps.err;
    re->start = f.s;
    re->accept = f.a;
    for (int i = 0; i < re->n; i++)
        closure_of(re, i, &re->closure[i]);
    for (int i = 0; i < re->n; i++)
        re->dist[i] = INF;
    re->dist[re->accept] = 0;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < re->n; i++) {
            int best = re->dist[i];
            for (int k = 0; k < 2; k++) {
                int e = re->st[i].eps[k];
                if (e >= 0 && re->dist[e] < best)
                    best = re->dist[e];
            }
            int nx = re->st[i].next;
            if (nx >= 0 && (re->st[i].cls[0] | re->st[i].cls[1]) && re->dist[nx] + 1 < best)
                best = re->dist[nx] + 1;
            if (best < re->dist[i]) {
                re->dist[i] = best;
                changed = 1;
            }
        }
    }
    if (re->dist[re->start] >= INF)
        return nd_error(ND_EUNSUPPORTED, "pattern can never match");
    return ND_OK;
}

nd_re_set nd_re_initial(const nd_regex *re)
{
    return re->closure[re->start];
}

nd_re_set nd_re_step(const nd_regex *re, nd_re_set s, int ch)
{
    nd_re_set out = {{0}};
    if (ch < 0 || ch > 127)
        return out;
    uint64_t bit = 1ull << (ch & 63);
    int word = ch >> 6;
    for (int w = 0; w < ND_RE_WORDS; w++) {
        uint64_t m = s.w[w];
        while (m) {
            int i = w * 64 + __builtin_ctzll(m);
            m &= m - 1;
            int nx = re->st[i].next;
            if (nx >= 0 && (re->st[i].cls[word] & bit))
                set_or(&out, &re->closure[nx]);
        }
    }
    return out;
}

int nd_re_empty(nd_re_set s)
{
    uint64_t any = 0;
    for (int w = 0; w < ND_RE_WORDS; w++)
        any |= s.w[w];
    return !any;
}

int nd_re_accepts(const nd_regex *re, nd_re_set s)
{
    return set_has(&s, re->accept);
}

int nd_re_dist(const nd_regex *re, nd_re_set s)
{
    int best = INF;
    for (int w = 0; w < ND_RE_WORDS; w++) {
        uint64_t m = s.w[w];
        while (m) {
            int i = w * 64 + __builtin_ctzll(m);
            m &= m - 1;
            if (re->dist[i] < best)
                best = re->dist[i];
        }
    }
    return best;
}

/* One step over every character a JSON string under a pattern can hold:
 * printable ASCII and DEL raw, \b \f \n \r \t escaped (no \u). */
static nd_re_set any_step(const nd_regex *re, nd_re_set s)
{
    static const uint64_t admit[2] = {0xFFFFFFFF00000000ull | 1ull << '\b' | 1ull << '\t' |
                                          1ull << '\n' | 1ull << '\f' | 1ull << '\r',
                                      ~0ull};
    nd_re_set out = {{0}};
    for (int w = 0; w < ND_RE_WORDS; w++) {
        uint64_t m = s.w[w];
        while (m) {
            int i = w * 64 + __builtin_ctzll(m);
            m &= m - 1;
            int nx = re->st[i].next;
            if (nx >= 0 && ((re->st[i].cls[0] & admit[0]) | (re->st[i].cls[1] & admit[1])))
                set_or(&out, &re->closure[nx]);
        }
    }
    return out;
}

int nd_re_len_min(const nd_regex *re, nd_re_set s, int lo, int hi)
{
    if (lo < 0)
        lo = 0;
    if (hi < lo)
        return -1;
    /* unbounded: the sets reachable in exactly t steps settle (or cycle)
     * well within this many steps past lo for a 320-state automaton */
    int limit = hi - lo > 1 << 16 ? lo + (1 << 16) : hi;
    for (int t = 0; t <= limit; t++) {
        if (t >= lo && set_has(&s, re->accept))
            return t;
        nd_re_set n = any_step(re, s);
        if (nd_re_empty(n))
            return -1;
        if (!memcmp(n.w, s.w, sizeof n.w)) /* fixed point */
            return set_has(&s, re->accept) && lo <= hi ? (t + 1 > lo ? t + 1 : lo) : -1;
        s = n;
    }
    return -1;
}

int nd_re_match(const nd_regex *re, const char *s)
{
    nd_re_set st = nd_re_initial(re);
    for (; *s; s++) {
        st = nd_re_step(re, st, (unsigned char)*s);
        if (nd_re_empty(st))
            return 0;
    }
    return nd_re_accepts(re, st);
}

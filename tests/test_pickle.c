/* Unit tests for the pickle reader/writer: value building, C -> bytes -> C
 * round trips, and hostile hand-made inputs. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "io/pickle.h"
#include "testutil.h"

#define LIT(s) (const unsigned char *)(s), (sizeof(s) - 1)

static int load_rc(const unsigned char *p, size_t n)
{
    pv *v = NULL;
    int rc = pickle_loads(p, n, "t", &v);
    if (rc == 0) {
        CHECK(v != NULL);
        pv_decref(v);
    } else {
        CHECK(v == NULL);
    }
    return rc;
}

static void expect_err(const unsigned char *p, size_t n, int code, const char *needle, int line)
{
    int rc = load_rc(p, n);
    CHECK_MSG(rc == code, "line %d: got %s (%s), want %s", line, nd_status_name(rc),
              nd_last_error(), nd_status_name(code));
    if (needle)
        CHECK_MSG(strstr(nd_last_error(), needle) != NULL, "line %d: message '%s' lacks '%s'", line,
                  nd_last_error(), needle);
    if (rc)
        CHECK_MSG(strstr(nd_last_error(), "offset") != NULL, "line %d: no offset in '%s'", line,
                  nd_last_error());
}
#define EXPECT_ERR(lit, code, needle) expect_err(LIT(lit), code, needle, __LINE__)

/* dumps -> loads -> equal; returns the bytes for further use */
static unsigned char *round_trip(const pv *v, size_t *len_out)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = pickle_dumps(v, &buf, &len);
    CHECK_MSG(rc == 0, "dumps: %s", nd_last_error());
    if (rc)
        return NULL;
    pv *back = NULL;
    rc = pickle_loads(buf, len, "rt", &back);
    CHECK_MSG(rc == 0, "loads: %s", nd_last_error());
    CHECK(pv_equal(v, back));
    pv_decref(back);
    if (len_out)
        *len_out = len;
    return buf;
}

static void test_build(void)
{
    pv *d = pv_dict();
    CHECK(pv_dict_set(d, "a", pv_int(1)) == 0);
    CHECK(pv_dict_set(d, "b", pv_str("x")) == 0);
    CHECK(pv_dict_set(d, "a", pv_int(2)) == 0); /* replaces in place */
    CHECK(d->u.dict.n == 2);
    CHECK(pv_dict_get(d, "a") && pv_dict_get(d, "a")->u.i == 2);
    CHECK(strcmp(d->u.dict.keys[0]->u.str.s, "a") == 0);
    CHECK(pv_dict_get(d, "zz") == NULL);
    CHECK(pv_dict_set(d, "self", pv_incref(d)) == ND_EARG); /* refused, ref consumed */
    pv *l = pv_list();
    CHECK(pv_append(l, pv_none()) == 0);
    CHECK(pv_append(l, pv_bool(3)) == 0);
    CHECK(l->u.seq.items[1]->u.b == 1);
    CHECK(pv_append(d, pv_none()) == ND_EARG);
    pv *s = pv_strn("a\0b", 3);
    CHECK(s->u.str.len == 3 && s->u.str.s[3] == 0);
    CHECK(pv_append(l, s) == 0);
    CHECK(pv_dict_set(d, "l", l) == 0);
    pv_decref(d);

    int64_t sh[2] = {2, 3};
    pv *a = pv_ndarray(ND_F32, 2, sh, NULL);
    CHECK(a && a->u.nd.nbytes == 24 && pv_nd_numel(a) == 6);
    CHECK(((float *)a->u.nd.data)[5] == 0.0f);
    pv_decref(a);
    int64_t neg[1] = {-1}, big[2] = {INT64_MAX, 2};
    CHECK(pv_ndarray(ND_F32, 1, neg, NULL) == NULL);
    CHECK(pv_ndarray(ND_F32, 2, big, NULL) == NULL);
    CHECK(pv_ndarray(ND_F32, PV_MAX_NDIM + 1, sh, NULL) == NULL);
    CHECK(nd_dtype_size(ND_F16) == 2 && nd_dtype_size(ND_BOOL) == 1);
    CHECK(strcmp(nd_dtype_name(ND_I64), "int64") == 0);
    CHECK(pv_nd_numel(NULL) == -1);
    pv_decref(NULL);
}

static pv *sample_array(nd_dtype t, int ndim, const int64_t *shape)
{
    pv *a = pv_ndarray(t, ndim, shape, NULL);
    unsigned char *p = a->u.nd.data;
    for (size_t i = 0; i < a->u.nd.nbytes; i++)
        p[i] = (unsigned char)(i * 37 + 11);
    if (t == ND_BOOL)
        for (size_t i = 0; i < a->u.nd.nbytes; i++)
            p[i] &= 1;
    return a;
}

static void test_round_trip(void)
{
    static const int64_t ints[] = {0,          1,         255,         256,
                                   65535,      65536,     -1,          -128,
                                   -129,       INT32_MIN, INT32_MAX,   (int64_t)INT32_MAX + 1,
                                   INT64_MIN,  INT64_MAX, 1LL << 40,   -(1LL << 40),
                                   0x7fffff00, 1LL << 55, -(1LL << 55)};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        pv *v = pv_int(ints[i]);
        free(round_trip(v, NULL));
        pv_decref(v);
    }
    double fl[] = {0.0, -0.0, 1.5, -1e300, 5e-324, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        pv *v = pv_float(fl[i]);
        free(round_trip(v, NULL));
        pv_decref(v);
    }
    pv *scalars[] = {pv_none(),
                     pv_bool(0),
                     pv_bool(1),
                     pv_str(""),
                     pv_strn("\0x", 2),
                     pv_bytes("", 0),
                     pv_bytes("\xff\x00", 2),
                     pv_list(),
                     pv_tuple(),
                     pv_dict()};
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        free(round_trip(scalars[i], NULL));
        pv_decref(scalars[i]);
    }
    /* long str/bytes pick BINUNICODE/BINBYTES */
    char *big = malloc(70000);
    memset(big, 'q', 70000);
    pv *v = pv_strn(big, 70000);
    free(round_trip(v, NULL));
    pv_decref(v);
    v = pv_bytes(big, 300);
    free(round_trip(v, NULL));
    pv_decref(v);
    free(big);

    /* every dtype, several shapes, inside a checkpoint-like tree */
    pv *root = pv_dict();
    pv_dict_set(root, "format_version", pv_int(2));
    pv *params = pv_dict();
    static const int64_t shapes[][5] = {{0},          {1, 7},          {2, 3, 4},
                                        {3, 2, 2, 2}, {4, 1, 2, 3, 1}, {2, 0, 5}};
    static const int ndims[] = {0, 2, 3, 4, 5, 3};
    char key[64];
    for (int t = ND_F16; t <= ND_BOOL; t++) {
        for (int s = 0; s < 6; s++) {
            snprintf(key, sizeof key, "%s_%d", nd_dtype_name((nd_dtype)t), s);
            pv_dict_set(params, key, sample_array((nd_dtype)t, ndims[s], shapes[s]));
        }
    }
    pv_dict_set(root, "params", params);
    pv *cfg = pv_dict();
    pv_dict_set(cfg, "lr", pv_float(3e-4));
    pv_dict_set(cfg, "name", pv_str("needle"));
    pv_dict_set(cfg, "none", pv_none());
    for (int n = 0; n <= 5; n++) {
        pv *t = pv_tuple();
        for (int i = 0; i < n; i++)
            pv_append(t, pv_int(i * 1000));
        snprintf(key, sizeof key, "tuple%d", n);
        pv_dict_set(cfg, key, t);
    }
    pv *lst = pv_list();
    for (int i = 0; i < 2500; i++) /* several APPENDS batches */
        pv_append(lst, i % 2 ? pv_int(i) : pv_float(i));
    pv_dict_set(cfg, "list", lst);
    pv *one = pv_list();
    pv_append(one, pv_str("only"));
    pv_dict_set(cfg, "one", one);
    pv_dict_set(root, "config", cfg);
    pv *bigd = pv_dict();
    for (int i = 0; i < 2100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        pv_dict_set(bigd, key, pv_int(i));
    }
    pv_dict_set(root, "bigdict", bigd);

    size_t len = 0;
    unsigned char *buf = round_trip(root, &len);
    CHECK(buf != NULL);
    /* globals and dtypes are memoized: "_reconstruct" appears once */
    int count = 0;
    for (size_t i = 0; buf && i + 12 <= len; i++)
        count += memcmp(buf + i, "_reconstruct", 12) == 0;
    CHECK(count == 1);

    /* every proper prefix is truncated input */
    int all_format = 1;
    for (size_t n = 0; buf && n < len; n += (n < 4096 ? 1 : 997)) {
        int rc = load_rc(buf, n);
        if (rc != ND_EFORMAT) {
            all_format = 0;
            fprintf(stderr, "prefix %zu: %s %s\n", n, nd_status_name(rc), nd_last_error());
            break;
        }
    }
    CHECK(all_format);
    free(buf);

    /* file round trip through the atomic writer */
    char path[] = "/tmp/nd_pickle_testXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        close(fd);
        CHECK(pickle_dump_file(root, path) == 0);
        pv *back = NULL;
        CHECK(pickle_load_file(path, &back) == 0);
        CHECK(pv_equal(root, back));
        pv_decref(back);
        unlink(path);
    }
    pv *back = NULL;
    CHECK(pickle_load_file("/nonexistent/x.pkl", &back) == ND_EIO && back == NULL);
    pv_decref(root);

    /* a shared object is written twice and read back equal */
    pv *d = pv_dict();
    pv *shared = sample_array(ND_F64, 1, (const int64_t[]){3});
    pv_dict_set(d, "a", pv_incref(shared));
    pv_dict_set(d, "b", shared);
    size_t slen = 0;
    unsigned char *sbuf = round_trip(d, &slen);
    pv *sback = NULL;
    CHECK(sbuf && pickle_loads(sbuf, slen, "shared", &sback) == 0);
    if (sback) /* written once, read back as one shared object */
        CHECK(sback->u.dict.vals[0] == sback->u.dict.vals[1]);
    pv_decref(sback);
    free(sbuf);
    pv_decref(d);

    /* a DAG with 2^200 paths stays small when written */
    pv *dag = pv_list();
    for (int i = 0; i < 200; i++) {
        pv *up = pv_list();
        pv_append(up, pv_incref(dag));
        pv_append(up, dag);
        dag = up;
    }
    unsigned char *dbuf = NULL;
    size_t dlen = 0;
    CHECK(pickle_dumps(dag, &dbuf, &dlen) == 0 && dlen < 10000);
    pv *dback = NULL;
    CHECK(pickle_loads(dbuf, dlen, "dag", &dback) == 0);
    pv_decref(dback);
    free(dbuf);
    pv_decref(dag);
}

static void test_writer_errors(void)
{
    unsigned char *buf;
    size_t len;
    pv *deep = pv_list();
    for (int i = 0; i < 300; i++) {
        pv *outer = pv_list();
        pv_append(outer, deep);
        deep = outer;
    }
    CHECK(pickle_dumps(deep, &buf, &len) == ND_ELIMIT);
    pv_decref(deep);
    /* a cycle built through the API is caught by the depth cap */
    pv *a = pv_list(), *b = pv_list();
    pv_append(a, pv_incref(b));
    pv_append(b, pv_incref(a));
    CHECK(pickle_dumps(a, &buf, &len) == ND_ELIMIT);
    pv_decref(b->u.seq.items[0]); /* break the cycle */
    b->u.seq.n = 0;
    pv_decref(a);
    pv_decref(b);
    pv *bad = pv_ndarray(ND_F32, 1, (const int64_t[]){4}, NULL);
    bad->u.nd.nbytes = 3;
    CHECK(pickle_dumps(bad, &buf, &len) == ND_EARG);
    bad->u.nd.nbytes = 16;
    pv_decref(bad);
}

/* numpy protocol-2 style array pickle with shape bytes spliced in */
static int load_array_with(const char *shape, size_t shape_len, const char *data, size_t data_len,
                           const char *dtype)
{
    static const char pre[] = "\x80\x02"
                              "cnumpy.core.multiarray\n_reconstruct\n"
                              "cnumpy\nndarray\n"
                              "K\x00\x85"
                              "C\x01"
                              "b\x87R(K\x01";
    static const char dt1[] = "cnumpy\ndtype\nX\x02\x00\x00\x00";
    static const char dt2[] = "\x89\x88\x87R(K\x03X\x01\x00\x00\x00<NNN"
                              "J\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89";
    unsigned char buf[512];
    size_t n = 0;
#define PUT(p, len)                                                                                \
    do {                                                                                           \
        memcpy(buf + n, p, len);                                                                   \
        n += len;                                                                                  \
    } while (0)
    PUT(pre, sizeof pre - 1);
    PUT(shape, shape_len);
    PUT(dt1, sizeof dt1 - 1);
    PUT(dtype, 2);
    PUT(dt2, sizeof dt2 - 1);
    buf[n++] = 'C';
    buf[n++] = (unsigned char)data_len;
    PUT(data, data_len);
    PUT("tb.", 3);
#undef PUT
    pv *v = NULL;
    int rc = pickle_loads(buf, n, "arr", &v);
    if (rc == 0) {
        CHECK(v->kind == PV_NDARRAY);
        pv_decref(v);
    }
    return rc;
}

static void test_hostile(void)
{
    /* sanity: the array template itself loads */
    CHECK(load_array_with("K\x02\x85", 3, "\0\0\x80\x3f\0\0\0\x40", 8, "f4") == 0);
    CHECK(load_array_with("K\x02\x85", 3, "\0\0\x80\x3f\0\0\0", 7, "f4") == ND_EFORMAT);
    CHECK(load_array_with("K\x02\x85", 3, "\0\0\x80\x3f\0\0\0\x40", 8, "O8") == ND_EUNSUPPORTED);
    CHECK(load_array_with("K\x02\x85", 3, "\0\0\x80\x3f\0\0\0\x40", 8, "u4") == ND_EUNSUPPORTED);
    /* huge shape: product overflows */
    static const char huge2[] = "\x8a\x08\0\0\0\0\0\0\0\x40\x8a\x08\0\0\0\0\0\0\0\x40\x86";
    CHECK(load_array_with(huge2, sizeof huge2 - 1, "", 0, "f4") == ND_ELIMIT);
    /* huge shape that fits int64: data size mismatch, nothing allocated */
    static const char huge1[] = "\x8a\x06\0\0\0\0\0\x40\x85";
    CHECK(load_array_with(huge1, sizeof huge1 - 1, "", 0, "f8") == ND_EFORMAT);
    /* negative dim, too many dims */
    CHECK(load_array_with("J\xff\xff\xff\xff\x85", 6, "", 0, "f4") == ND_EFORMAT);
    CHECK(load_array_with("(K\1K\1K\1K\1K\1K\1K\1K\1K\1t", 20, "\0\0\0\0", 4, "f4") == ND_ELIMIT);

    EXPECT_ERR("cos\nsystem\n(S'ls'\ntR.", ND_EUNSAFE, "os.system");
    EXPECT_ERR("\x80\x04\x8c\x08"
               "builtins\x8c\x04"
               "eval\x93.",
               ND_EUNSAFE, "builtins.eval");
    EXPECT_ERR("\x80\x02"
               "c__builtin__\neval\n.",
               ND_EUNSAFE, "__builtin__.eval");
    EXPECT_ERR("\x80\x02"
               "ccollections\nOrderedDict\n)R.",
               ND_EUNSAFE, "collections.OrderedDict");
    EXPECT_ERR("(iposix\nsystem\n.", ND_EUNSAFE, "posix.system");
    EXPECT_ERR("\x80\x02\x82\x01.", ND_EUNSAFE, NULL);
    /* bytes() only without arguments; codecs only latin1 */
    EXPECT_ERR("\x80\x02"
               "c__builtin__\nbytes\nK\x10\x85R.",
               ND_EUNSAFE, "bytes");
    EXPECT_ERR("\x80\x02"
               "c_codecs\nencode\nX\x01\0\0\0aX\x05\0\0\0utf-8\x86R.",
               ND_EUNSAFE, "latin1");
    EXPECT_ERR("\x80\x02"
               "cnumpy\nndarray\n)R.",
               ND_EUNSUPPORTED, NULL);

    EXPECT_ERR("\x80\x04"
               "B\xff\xff\xff\xff",
               ND_EFORMAT, "truncated");
    EXPECT_ERR("\x80\x04\x8e\0\0\0\0\0\0\0\x80", ND_EFORMAT, "truncated");
    EXPECT_ERR("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff", ND_EFORMAT, "truncated");
    EXPECT_ERR("\x80\x05\x95\xff\xff\xff\xff\0\0\0\0N.", ND_EFORMAT, "frame");
    EXPECT_ERR("\x80\x04h\x05.", ND_EFORMAT, "memo");
    EXPECT_ERR("\x80\x04N\x94j\x01\0\0\0.", ND_EFORMAT, "memo");
    EXPECT_ERR("\x80\x04Nr\xff\xff\xff\x7f.", ND_EFORMAT, "memo");
    EXPECT_ERR("\x80\x06N.", ND_EUNSUPPORTED, "protocol 6");
    EXPECT_ERR("\x80\x04\xff", ND_EFORMAT, "invalid opcode");
    EXPECT_ERR("\x80\x04", ND_EFORMAT, "truncated");
    EXPECT_ERR("", ND_EFORMAT, "truncated");
    EXPECT_ERR("\x80\x04"
               "a.",
               ND_EFORMAT, "underflow");
    EXPECT_ERR("\x80\x04]N(a.", ND_EFORMAT, "underflow"); /* list hidden below the mark */
    EXPECT_ERR("\x80\x04]e.", ND_EFORMAT, "MARK");
    EXPECT_ERR("\x80\x04"
               "1.",
               ND_EFORMAT, "MARK");
    EXPECT_ERR("\x80\x04(N.", ND_EFORMAT, "STOP");
    EXPECT_ERR("\x80\x04NN.", ND_EFORMAT, "STOP");
    EXPECT_ERR("\x80\x04.", ND_EFORMAT, "STOP");
    EXPECT_ERR("\x80\x04"
               "0.",
               ND_EFORMAT, "MARK");
    EXPECT_ERR("\x80\x04}(K\x01u.", ND_EFORMAT, "odd");
    EXPECT_ERR("\x80\x04}(]K\x01u.", ND_EUNSUPPORTED, "dict key");
    EXPECT_ERR("\x80\x04\x8a\x09\0\0\0\0\0\0\0\0\x01.", ND_ELIMIT, "64 bits");
    EXPECT_ERR("\x80\x04\x8b\xff\xff\xff\xff.", ND_EFORMAT, "LONG4");
    EXPECT_ERR("\x80\x05\x97.", ND_EUNSUPPORTED, "out-of-band");
    EXPECT_ERR("\x80\x05N\x98.", ND_EUNSUPPORTED, "out-of-band");
    EXPECT_ERR("\x80\x04\x8f.", ND_EUNSUPPORTED, "set");
    EXPECT_ERR("\x80\x04]\x94h\x00"
               "a.",
               ND_EUNSUPPORTED, "itself");
    /* a list placed in another list is frozen: appending to it later
     * would be the first step of a reference cycle */
    EXPECT_ERR("\x80\x04]\x94]h\x00"
               "ah\x00N"
               "a.",
               ND_EUNSUPPORTED, "already stored");
    EXPECT_ERR("\x80\x04\x8c\x01"
               "a\x8c\x01"
               "b\x93.",
               ND_EUNSAFE, "a.b");
    EXPECT_ERR("\x80\x04"
               "K\x01\x8c\x01"
               "b\x93.",
               ND_EFORMAT, "STACK_GLOBAL");
    EXPECT_ERR("\x80\x04"
               "cnumpy\ndtype\n.",
               ND_EUNSUPPORTED, "result");
    EXPECT_ERR("\x80\x04]cnumpy\ndtype\na.", ND_EUNSUPPORTED, "cannot store");
    EXPECT_ERR("\x80\x04K\x01)R.", ND_EFORMAT, "calling");
    EXPECT_ERR("\x80\x04]]b.", ND_EUNSUPPORTED, "BUILD");
    EXPECT_ERR("\x80\x02I12x\n.", ND_EFORMAT, "digit");
    EXPECT_ERR("\x80\x02I99999999999999999999\n.", ND_ELIMIT, "64 bits");
    EXPECT_ERR("\x80\x02I12", ND_EFORMAT, "newline");
    EXPECT_ERR("\x80\x02"
               "cnumpy\n",
               ND_EFORMAT, "newline");

    /* nesting bombs */
    size_t n = 200000;
    unsigned char *bomb = malloc(n + 4);
    for (size_t i = 0; i < n; i += 2) {
        bomb[i] = ']';
        bomb[i + 1] = '(';
    }
    expect_err(bomb, n, ND_ELIMIT, "MARK", __LINE__);
    bomb[0] = ')';
    memset(bomb + 1, 0x85, n - 1);
    bomb[n] = '.';
    expect_err(bomb, n + 1, ND_ELIMIT, "nested", __LINE__);
    /* list nesting through the memo: L; repeat { BINPUT 0, POP, X, BINGET 0,
     * APPEND } wraps the previous list one level deeper each round */
    size_t m = 0;
    bomb[m++] = ']';
    while (m + 8 < n) {
        memcpy(bomb + m,
               "q\x00"
               "0]h\x00"
               "a",
               7);
        m += 7;
    }
    bomb[m++] = '.';
    expect_err(bomb, m, ND_ELIMIT, "nested", __LINE__);
    free(bomb);

    /* duplicate dict keys: Python keeps the first position, last value */
    static const unsigned char dup[] = "\x80\x04}(K\x01K\x02\x8c\x01xK\x05K\x01K\x03u.";
    pv *v = NULL;
    CHECK(pickle_loads(dup, sizeof dup - 1, "dup", &v) == 0);
    if (v) {
        CHECK(v->u.dict.n == 2);
        CHECK(v->u.dict.keys[0]->u.i == 1 && v->u.dict.vals[0]->u.i == 3);
        CHECK(v->u.dict.keys[1]->kind == PV_STR);
        pv_decref(v);
    }
    /* memo sharing: [x, x] refers to one object */
    static const unsigned char share[] = "\x80\x04](\x8c\x03"
                                         "abc\x94h\x00"
                                         "e.";
    CHECK(pickle_loads(share, sizeof share - 1, "share", &v) == 0);
    if (v) {
        CHECK(v->u.seq.n == 2 && v->u.seq.items[0] == v->u.seq.items[1]);
        CHECK(v->u.seq.items[0]->refs == 2);
        pv_decref(v);
    }
    /* text INT/LONG forms and protocol-0 booleans */
    static const unsigned char txt[] = "(I01\nI00\nI-42\nL123L\nl.";
    CHECK(pickle_loads(txt, sizeof txt - 1, "txt", &v) == 0);
    if (v) {
        CHECK(v->u.seq.n == 4 && v->u.seq.items[0]->kind == PV_BOOL &&
              v->u.seq.items[0]->u.b == 1 && v->u.seq.items[2]->u.i == -42 &&
              v->u.seq.items[3]->u.i == 123);
        pv_decref(v);
    }
    /* NULL handling */
    CHECK(pickle_loads(NULL, 5, "x", &v) == ND_EARG);
}

int main(void)
{
    test_build();
    test_round_trip();
    test_writer_errors();
    test_hostile();
    return tu_finish("test_pickle");
}

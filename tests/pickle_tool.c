/* Test helper for tests/test_pickle_interop.py.
 *
 *   pickle_tool dump FILE       canonical text rendering of the value
 *   pickle_tool rewrite IN OUT  pickle_load_file + pickle_dump_file
 *
 * On a load error prints "ERROR <ND_NAME> <message>" and exits 3. The
 * rendering is one token line per value in prefix order; numbers and
 * payloads are hex so Python can produce the identical text. */
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "io/pickle.h"

static void hex(const void *p, size_t n)
{
    const unsigned char *b = p;
    if (n == 0)
        fputs("-", stdout);
    for (size_t i = 0; i < n; i++)
        printf("%02x", b[i]);
}

static void render(const pv *v)
{
    switch (v->kind) {
    case PV_NONE: puts("none"); return;
    case PV_BOOL: printf("bool %d\n", v->u.b); return;
    case PV_INT: printf("int %lld\n", (long long)v->u.i); return;
    case PV_FLOAT: {
        unsigned long long bits;
        memcpy(&bits, &v->u.f, 8);
        printf("float %016llx\n", bits);
        return;
    }
    case PV_STR:
    case PV_BYTES:
        fputs(v->kind == PV_STR ? "str " : "bytes ", stdout);
        hex(v->u.str.s, v->u.str.len);
        putchar('\n');
        return;
    case PV_LIST:
    case PV_TUPLE:
        printf("%s %zu\n", v->kind == PV_LIST ? "list" : "tuple", v->u.seq.n);
        for (size_t i = 0; i < v->u.seq.n; i++)
            render(v->u.seq.items[i]);
        return;
    case PV_DICT:
        printf("dict %zu\n", v->u.dict.n);
        for (size_t i = 0; i < v->u.dict.n; i++) {
            render(v->u.dict.keys[i]);
            render(v->u.dict.vals[i]);
        }
        return;
    case PV_NDARRAY:
        printf("ndarray %s [", nd_dtype_name(v->u.nd.dtype));
        for (int i = 0; i < v->u.nd.ndim; i++)
            printf("%s%lld", i ? "," : "", (long long)v->u.nd.shape[i]);
        fputs("] ", stdout);
        hex(v->u.nd.data, v->u.nd.nbytes);
        putchar('\n');
        return;
    }
    puts("?");
}

int main(int argc, char **argv)
{
    pv *v = NULL;
    if (argc == 3 && strcmp(argv[1], "dump") == 0) {
        int rc = pickle_load_file(argv[2], &v);
        if (rc) {
            printf("ERROR %s %s\n", nd_status_name(rc), nd_last_error());
            return 3;
        }
        render(v);
        pv_decref(v);
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "rewrite") == 0) {
        int rc = pickle_load_file(argv[2], &v);
        if (!rc)
            rc = pickle_dump_file(v, argv[3]);
        pv_decref(v);
        if (rc) {
            printf("ERROR %s %s\n", nd_status_name(rc), nd_last_error());
            return 3;
        }
        return 0;
    }
    fprintf(stderr, "usage: pickle_tool dump FILE | rewrite IN OUT\n");
    return 2;
}

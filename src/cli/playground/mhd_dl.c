/* libmicrohttpd through dlopen (see mhd_dl.h). */
#define _POSIX_C_SOURCE 200809L
#define PG_MHD_DL_IMPL
#include "cli/playground/mhd_dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pg_mhd_api pg_mhd;

static const char *const names[] = {
#if defined(__APPLE__)
    "libmicrohttpd.12.dylib",
    "libmicrohttpd.dylib",
#else
    "libmicrohttpd.so.12",
    "libmicrohttpd.so",
#endif
};

int pg_mhd_load(char *why, size_t why_len)
{
    if (pg_mhd.start_daemon)
        return 0;
    void *h = NULL;
    const char *want = getenv("NEEDLE_LIBMHD"); /* a path or soname; tests */
    int forced = want && want[0];
    if (forced)
        h = dlopen(want, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; !h && !forced && i < sizeof names / sizeof *names; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_len,
                 "cannot load libmicrohttpd (%s): install it (Debian: apt-get install "
                 "libmicrohttpd12)",
                 e ? e : names[0]);
        return -1;
    }
    pg_mhd_api api;
    struct {
        const char *name;
        void *slot;
    } syms[] = {
        {"MHD_start_daemon", &api.start_daemon},
        {"MHD_stop_daemon", &api.stop_daemon},
        {"MHD_get_daemon_info", &api.get_daemon_info},
        {"MHD_lookup_connection_value", &api.lookup_connection_value},
        {"MHD_queue_response", &api.queue_response},
        {"MHD_create_response_from_buffer", &api.create_response_from_buffer},
        {"MHD_create_response_from_fd", &api.create_response_from_fd},
        {"MHD_add_response_header", &api.add_response_header},
        {"MHD_destroy_response", &api.destroy_response},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(why, why_len, "libmicrohttpd lacks %s", syms[i].name);
            dlclose(h);
            return -1;
        }
        /* function pointers travel through void * (POSIX dlsym) */
        memcpy(syms[i].slot, &f, sizeof f);
    }
    pg_mhd = api; /* the server starts after this, on this thread */
    return 0;
}

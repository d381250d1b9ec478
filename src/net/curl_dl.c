/* libcurl through dlopen (see curl_dl.h). */
#define _POSIX_C_SOURCE 200809L
#define ND_CURL_DL_IMPL
#include "net/curl_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

nd_curl_api nd_curl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];

/* the sonames of libcurl 7.16+ (ABI 4) by platform, then the dev symlink */
static const char *const names[] = {
#if defined(__APPLE__)
    "libcurl.4.dylib",
    "libcurl.dylib",
#else
    "libcurl.so.4",
    "libcurl.so",
#endif
};

static void load(void)
{
    void *h = NULL;
    const char *want = getenv("NEEDLE_LIBCURL"); /* a path or soname; tests */
    if (want && want[0])
        h = dlopen(want, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; !h && !(want && want[0]) && i < sizeof names / sizeof *names; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error,
                 "cannot load libcurl (%s): install libcurl4 (Debian: apt-get install libcurl4)",
                 e ? e : names[0]);
        return;
    }
    struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"curl_global_init", (void **)&nd_curl.global_init},
        {"curl_global_cleanup", (void **)&nd_curl.global_cleanup},
        {"curl_easy_init", (void **)&nd_curl.easy_init},
        {"curl_easy_setopt", (void **)&nd_curl.easy_setopt},
        {"curl_easy_getinfo", (void **)&nd_curl.easy_getinfo},
        {"curl_easy_perform", (void **)&nd_curl.easy_perform},
        {"curl_easy_cleanup", (void **)&nd_curl.easy_cleanup},
        {"curl_easy_strerror", (void **)&nd_curl.easy_strerror},
        {"curl_slist_append", (void **)&nd_curl.slist_append},
        {"curl_slist_free_all", (void **)&nd_curl.slist_free_all},
        {"curl_multi_init", (void **)&nd_curl.multi_init},
        {"curl_multi_add_handle", (void **)&nd_curl.multi_add_handle},
        {"curl_multi_remove_handle", (void **)&nd_curl.multi_remove_handle},
        {"curl_multi_perform", (void **)&nd_curl.multi_perform},
        {"curl_multi_poll", (void **)&nd_curl.multi_poll},
        {"curl_multi_info_read", (void **)&nd_curl.multi_info_read},
        {"curl_multi_cleanup", (void **)&nd_curl.multi_cleanup},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(load_error, sizeof load_error,
                     "libcurl lacks %s (curl_multi_poll needs libcurl 7.66 or newer)",
                     syms[i].name);
            memset(&nd_curl, 0, sizeof nd_curl);
            dlclose(h);
            return;
        }
        /* function pointers travel through void * (POSIX dlsym) */
        memcpy(syms[i].slot, &f, sizeof f);
    }
}

int nd_curl_load(void)
{
    pthread_once(&load_once, load);
    if (load_error[0])
        return nd_error(ND_EUNSUPPORTED, "%s", load_error);
    return ND_OK;
}

/* libcurl through dlopen (see curl_dl.h). */
#define _POSIX_C_SOURCE 200809L
#define ND_CURL_DL_IMPL
#include "net/curl_dl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dlib.h"
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
    static const nd_dlib_spec spec = {"libcurl",
                                      "NEEDLE_LIBCURL",
                                      names,
                                      sizeof names / sizeof *names,
                                      "apt-get install libcurl4",
                                      "(curl_multi_poll needs libcurl 7.66 or newer)"};
    const nd_dlib_sym syms[] = {
        {"curl_global_init", &nd_curl.global_init},
        {"curl_global_cleanup", &nd_curl.global_cleanup},
        {"curl_easy_init", &nd_curl.easy_init},
        {"curl_easy_setopt", &nd_curl.easy_setopt},
        {"curl_easy_getinfo", &nd_curl.easy_getinfo},
        {"curl_easy_perform", &nd_curl.easy_perform},
        {"curl_easy_cleanup", &nd_curl.easy_cleanup},
        {"curl_easy_strerror", &nd_curl.easy_strerror},
        {"curl_slist_append", &nd_curl.slist_append},
        {"curl_slist_free_all", &nd_curl.slist_free_all},
        {"curl_multi_init", &nd_curl.multi_init},
        {"curl_multi_add_handle", &nd_curl.multi_add_handle},
        {"curl_multi_remove_handle", &nd_curl.multi_remove_handle},
        {"curl_multi_perform", &nd_curl.multi_perform},
        {"curl_multi_poll", &nd_curl.multi_poll},
        {"curl_multi_info_read", &nd_curl.multi_info_read},
        {"curl_multi_cleanup", &nd_curl.multi_cleanup},
    };
    nd_dlib_load(&spec, syms, sizeof syms / sizeof *syms, load_error, sizeof load_error);
}

int nd_curl_load(void)
{
    pthread_once(&load_once, load);
    if (load_error[0])
        return nd_error(ND_EUNSUPPORTED, "%s", load_error);
    return ND_OK;
}

/* libcurl, loaded on first use (dlopen) instead of linked: the engine
 * commands (`needle run`, `bench decode`, ...) never map libcurl and its TLS
 * stack (~5 MB of resident pages, ~25 libraries to relocate at start), and
 * the program runs where libcurl is missing until a download is asked for.
 *
 * Files that call libcurl include this header instead of <curl/curl.h>;
 * the curl_* names below then go through the table nd_curl_load() fills. */
#ifndef ND_CURL_DL_H
#define ND_CURL_DL_H

#ifndef CURL_DISABLE_TYPECHECK
#define CURL_DISABLE_TYPECHECK /* curl_easy_setopt etc. must stay names */
#endif
#include <curl/curl.h>

typedef struct {
    CURLcode (*global_init)(long);
    void (*global_cleanup)(void);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    CURLcode (*easy_perform)(CURL *);
    void (*easy_cleanup)(CURL *);
    const char *(*easy_strerror)(CURLcode);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_add_handle)(CURLM *, CURL *);
    CURLMcode (*multi_remove_handle)(CURLM *, CURL *);
    CURLMcode (*multi_perform)(CURLM *, int *);
    CURLMcode (*multi_poll)(CURLM *, struct curl_waitfd[], unsigned int, int, int *);
    CURLMsg *(*multi_info_read)(CURLM *, int *);
    CURLMcode (*multi_cleanup)(CURLM *);
} nd_curl_api;

extern nd_curl_api nd_curl;

/* Load libcurl once (thread-safe): $NEEDLE_LIBCURL (a path or soname)
 * when set, else the platform's libcurl soname. ND_OK, or ND_EUNSUPPORTED with a message naming
 * the library that could not be loaded or the symbol it lacks. */
int nd_curl_load(void);

#ifndef ND_CURL_DL_IMPL
#undef curl_global_init
#undef curl_global_cleanup
#undef curl_easy_init
#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_easy_perform
#undef curl_easy_cleanup
#undef curl_easy_strerror
#undef curl_slist_append
#undef curl_slist_free_all
#undef curl_multi_init
#undef curl_multi_add_handle
#undef curl_multi_remove_handle
#undef curl_multi_perform
#undef curl_multi_poll
#undef curl_multi_info_read
#undef curl_multi_cleanup
#define curl_global_init nd_curl.global_init
#define curl_global_cleanup nd_curl.global_cleanup
#define curl_easy_init nd_curl.easy_init
#define curl_easy_setopt nd_curl.easy_setopt
#define curl_easy_getinfo nd_curl.easy_getinfo
#define curl_easy_perform nd_curl.easy_perform
#define curl_easy_cleanup nd_curl.easy_cleanup
#define curl_easy_strerror nd_curl.easy_strerror
#define curl_slist_append nd_curl.slist_append
#define curl_slist_free_all nd_curl.slist_free_all
#define curl_multi_init nd_curl.multi_init
#define curl_multi_add_handle nd_curl.multi_add_handle
#define curl_multi_remove_handle nd_curl.multi_remove_handle
#define curl_multi_perform nd_curl.multi_perform
#define curl_multi_poll nd_curl.multi_poll
#define curl_multi_info_read nd_curl.multi_info_read
#define curl_multi_cleanup nd_curl.multi_cleanup
#endif

#endif

/* libmicrohttpd through dlopen (see mhd_dl.h). */
#define _POSIX_C_SOURCE 200809L
#define PG_MHD_DL_IMPL
#include "cli/playground/mhd_dl.h"

#include "core/dlib.h"

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
    static const nd_dlib_spec spec = {"libmicrohttpd",
                                      "NEEDLE_LIBMHD",
                                      names,
                                      sizeof names / sizeof *names,
                                      "apt-get install libmicrohttpd12",
                                      NULL};
    pg_mhd_api api;
    const nd_dlib_sym syms[] = {
        {"MHD_start_daemon", &api.start_daemon},
        {"MHD_stop_daemon", &api.stop_daemon},
        {"MHD_get_daemon_info", &api.get_daemon_info},
        {"MHD_lookup_connection_value", &api.lookup_connection_value},
        {"MHD_get_connection_info", &api.get_connection_info},
        {"MHD_queue_response", &api.queue_response},
        {"MHD_create_response_from_buffer", &api.create_response_from_buffer},
        {"MHD_create_response_from_fd", &api.create_response_from_fd},
        {"MHD_add_response_header", &api.add_response_header},
        {"MHD_destroy_response", &api.destroy_response},
    };
    if (nd_dlib_load(&spec, syms, sizeof syms / sizeof *syms, why, why_len))
        return -1;
    pg_mhd = api; /* the server starts after this, on this thread */
    return 0;
}

/* libmicrohttpd, loaded when `needle playground` starts (dlopen) instead of
 * linked: every other command would otherwise map it and its TLS stack
 * (GnuTLS, nettle, p11-kit: ~3 MB of resident pages and ~10 libraries to
 * relocate), which the engine's memory budget cannot spare.
 *
 * server.c includes this header instead of <microhttpd.h>; the MHD_* calls
 * below then go through the table pg_mhd_load() fills. */
#ifndef ND_PG_MHD_DL_H
#define ND_PG_MHD_DL_H

#include <microhttpd.h>

typedef struct {
    __typeof__(&MHD_start_daemon) start_daemon;
    __typeof__(&MHD_stop_daemon) stop_daemon;
    __typeof__(&MHD_get_daemon_info) get_daemon_info;
    __typeof__(&MHD_lookup_connection_value) lookup_connection_value;
    __typeof__(&MHD_get_connection_info) get_connection_info;
    __typeof__(&MHD_queue_response) queue_response;
    __typeof__(&MHD_create_response_from_buffer) create_response_from_buffer;
    __typeof__(&MHD_create_response_from_fd) create_response_from_fd;
    __typeof__(&MHD_add_response_header) add_response_header;
    __typeof__(&MHD_destroy_response) destroy_response;
} pg_mhd_api;

extern pg_mhd_api pg_mhd;

/* Load libmicrohttpd once: $NEEDLE_LIBMHD (a path or soname) when set,
 * else the platform soname. 0, or -1 with the reason in `why`. */
int pg_mhd_load(char *why, size_t why_len);

#ifndef PG_MHD_DL_IMPL
#define MHD_start_daemon pg_mhd.start_daemon
#define MHD_stop_daemon pg_mhd.stop_daemon
#define MHD_get_daemon_info pg_mhd.get_daemon_info
#define MHD_lookup_connection_value pg_mhd.lookup_connection_value
#define MHD_get_connection_info pg_mhd.get_connection_info
#define MHD_queue_response pg_mhd.queue_response
#define MHD_create_response_from_buffer pg_mhd.create_response_from_buffer
#define MHD_create_response_from_fd pg_mhd.create_response_from_fd
#define MHD_add_response_header pg_mhd.add_response_header
#define MHD_destroy_response pg_mhd.destroy_response
#endif

#endif

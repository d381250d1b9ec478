/* Status codes and the thread-local error message.
 *
 * Library functions return 0 on success or a negative ND_E* code, and
 * record a human-readable message with nd_error(). Nothing in src/ prints
 * or exits; the CLI turns the message into "needle: ...". */
#ifndef ND_STATUS_H
#define ND_STATUS_H

#include <stddef.h>

enum {
    ND_OK = 0,
    ND_EIO = -1,      /* file could not be opened/read/written */
    ND_EFORMAT = -2,  /* input is malformed or truncated */
    ND_EUNSAFE = -3,  /* pickle asked for a global outside the whitelist */
    ND_ELIMIT = -4,   /* a size, depth or count is beyond what we accept */
    ND_ESHAPE = -5,   /* a tensor is missing or has the wrong shape */
    ND_ENOMEM = -6,   /* allocation failed */
    ND_EARG = -7,     /* bad argument from the caller */
    ND_ENUMERIC = -8, /* NaN/Inf where a finite number is required */
    ND_EUNSUPPORTED = -9,
    ND_EINTERRUPT = -10, /* stopped on request (a signal, --stop-after) */
};

/* Record a printf-style message for the calling thread and return `code`,
 * so call sites read `return nd_error(ND_EFORMAT, "...", ...);`. */
int nd_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the current message with "prefix: " (adds context while
 * unwinding, e.g. the file name). Returns `code`. */
int nd_error_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last message ("" if none). */
const char *nd_last_error(void);

/* Short symbolic name of a status code ("ND_EFORMAT"). */
const char *nd_status_name(int code);

#endif

#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char nd_msg[1024];

int nd_error(int code, const char *fmt, ...)
{
    /* formatted aside first: an argument may be the message itself
     * (nd_error(code, "%s", nd_last_error()) keeps it, not "") */
    char msg[sizeof nd_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(nd_msg, msg, sizeof msg);
    return code;
}

int nd_error_prefix(int code, const char *fmt, ...)
{
    char prefix[512], old[sizeof nd_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, nd_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof nd_msg - 3)
        n = sizeof nd_msg - 3;
    memcpy(nd_msg, prefix, n);
    memcpy(nd_msg + n, ": ", 2);
    size_t m = strlen(old);
    if (m > sizeof nd_msg - n - 3)
        m = sizeof nd_msg - n - 3;
    memcpy(nd_msg + n + 2, old, m);
    nd_msg[n + 2 + m] = 0;
    return code;
}

const char *nd_last_error(void)
{
    return nd_msg;
}

const char *nd_status_name(int code)
{
    switch (code) {
    case ND_OK: return "ND_OK";
    case ND_EIO: return "ND_EIO";
    case ND_EFORMAT: return "ND_EFORMAT";
    case ND_EUNSAFE: return "ND_EUNSAFE";
    case ND_ELIMIT: return "ND_ELIMIT";
    case ND_ESHAPE: return "ND_ESHAPE";
    case ND_ENOMEM: return "ND_ENOMEM";
    case ND_EARG: return "ND_EARG";
    case ND_ENUMERIC: return "ND_ENUMERIC";
    case ND_EUNSUPPORTED: return "ND_EUNSUPPORTED";
    case ND_EINTERRUPT: return "ND_EINTERRUPT";
    default: return "ND_E?";
    }
}

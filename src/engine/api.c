/* The upstream ABI (needle/__init__.py): one global model and session over
 * the handle API, serialised by a mutex. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "engine/engine.h"
#include "needle.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static needle_model *g_model;
static needle_session *g_session;
static char g_err[1024];
static int g_load_called;     /* then a missing model is an error, never the base */
static char g_init_err[1024]; /* why the last needle_init failed, or "" */

static void remember(void)
{
    snprintf(g_err, sizeof g_err, "%s", nd_last_error());
}

/* g_err holds why the last needle_load failed (once wrapped, kept) */
static void load_failed_error(void)
{
    if (!strncmp(g_err, "no model loaded", 15))
        return;
    char prev[sizeof g_err];
    snprintf(prev, sizeof prev, "%s", g_err);
    snprintf(g_err, sizeof g_err, "no model loaded: the last needle_load failed (%.900s)", prev);
}

int needle_load(const unsigned char *cact, unsigned long long n)
{
    pthread_mutex_lock(&g_lock);
    int rc = NEEDLE_OK;
    needle_model *m = NULL;
    g_load_called = 1;
    if (n > (unsigned long long)SIZE_MAX) {
        nd_error(ND_ELIMIT, "archive of %llu bytes is too large", n);
    } else {
        m = needle_model_load_buffer(cact, (size_t)n);
    }
    if (!m) {
        remember();
        rc = NEEDLE_EFORMAT;
    } else {
        needle_session_free(g_session);
        g_session = NULL;
        needle_model_free(g_model);
        g_model = m;
        g_err[0] = 0;
        g_init_err[0] = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int needle_init(const char *system, const char *tools_json, const char *tool_index_path)
{
    pthread_mutex_lock(&g_lock);
    int rc;
    if (!g_model && !g_load_called) {
        /* as upstream: without needle_load, the built-in base answers */
        g_model = needle_model_load_default();
        if (!g_model)
            snprintf(g_err, sizeof g_err,
                     "no model loaded: call needle_load with a .cact first (%.900s)",
                     nd_last_error());
    } else if (!g_model) {
        load_failed_error();
    }
    if (!g_model) {
        rc = NEEDLE_ESTATE;
    } else {
        needle_session *s =
            needle_session_new_with_index(g_model, system, tools_json, tool_index_path);
        if (!s) {
            remember();
            snprintf(g_init_err, sizeof g_init_err, "%s", g_err);
            /* the session of an earlier init does not answer for these tools */
            needle_session_free(g_session);
            g_session = NULL;
            rc = NEEDLE_EFORMAT;
        } else {
            g_init_err[0] = 0;
            needle_session_free(g_session);
            g_session = s;
            rc = needle_session_context_tokens(s);
            g_err[0] = 0;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int needle_complete(const char *text, int max_new_tokens, char *buf, int buf_len)
{
    pthread_mutex_lock(&g_lock);
    int rc;
    if (!g_session) {
        if (g_model && g_init_err[0]) /* the envelope says why, as init did */
            snprintf(g_err, sizeof g_err, "no session: the last needle_init failed: %.950s",
                     g_init_err);
        else if (g_model)
            snprintf(g_err, sizeof g_err, "no session: call needle_init first");
        else if (g_load_called)
            load_failed_error();
        else if (!g_err[0])
            snprintf(g_err, sizeof g_err, "no model loaded: call needle_load, then needle_init");
        /* the envelope needle.h promises, when it fits */
        rc = nd_error_envelope(g_err, g_model ? "no_session" : "no_model", buf, buf_len) < 0
                 ? NEEDLE_EBUFFER
                 : NEEDLE_ESTATE;
    } else {
        rc = needle_session_complete(g_session, text, max_new_tokens, buf, buf_len);
        if (rc < 0)
            snprintf(g_err, sizeof g_err, "%s", needle_session_error(g_session));
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Upstream 3.x's embed(): called once with out NULL for the size, then
 * with room for it; both return the dimension. */
int needle_embed(const char *text, float *out, int dim)
{
    pthread_mutex_lock(&g_lock);
    int rc;
    if (!g_model) {
        if (g_load_called)
            load_failed_error();
        else
            snprintf(g_err, sizeof g_err, "no model loaded: call needle_load first");
        rc = NEEDLE_ESTATE;
    } else if (!text || dim < 0 || (!out && dim > 0)) {
        snprintf(g_err, sizeof g_err, "needle_embed: NULL text or no room for %d floats", dim);
        rc = NEEDLE_EARG;
    } else {
        rc = out ? needle_model_embed(g_model, text, out, dim) : needle_model_embed_dim(g_model);
        if (rc < 0)
            snprintf(g_err, sizeof g_err, "%s", needle_thread_error());
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

void needle_reset(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_session)
        needle_session_reset(g_session);
    pthread_mutex_unlock(&g_lock);
}

const char *needle_last_error(void)
{
    /* a copy per thread: g_err changes under the lock while others run */
    static _Thread_local char copy[sizeof g_err];
    pthread_mutex_lock(&g_lock);
    memcpy(copy, g_err, sizeof copy);
    pthread_mutex_unlock(&g_lock);
    return copy;
}

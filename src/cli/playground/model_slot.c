/* The playground's model slot: one loaded model, the session of the last
 * tool set, and the model's display name, all behind one mutex. A load
 * parses the new archive before taking the lock, so a bad upload never
 * touches the model in use. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/playground/playground.h"
#include "needle.h"

static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static needle_model *slot_model;
static needle_session *slot_session;
static char *slot_tools; /* tools JSON the session was made with */
static char slot_name[256] = "(no model)";
static int slot_max_new = 256;

static void drop_session_locked(void)
{
    needle_session_free(slot_session);
    slot_session = NULL;
    free(slot_tools);
    slot_tools = NULL;
}

static void swap_in(needle_model *m, const char *name)
{
    pthread_mutex_lock(&slot_lock);
    drop_session_locked();
    needle_model_free(slot_model);
    slot_model = m;
    snprintf(slot_name, sizeof slot_name, "%s", name);
    pthread_mutex_unlock(&slot_lock);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int pg_slot_init(const char *weights_path, int max_new_tokens)
{
    slot_max_new = max_new_tokens;
    if (!weights_path)
        return 0;
    char why[512];
    if (pg_slot_load_path(weights_path, base_name(weights_path), why, sizeof why)) {
        fprintf(stderr, "needle playground: %s: %s\n", weights_path, why);
        return 1;
    }
    return 0;
}

void pg_slot_free(void)
{
    swap_in(NULL, "(no model)");
}

int pg_slot_load_buffer(const void *data, size_t len, const char *name, char *why, size_t why_len)
{
    needle_model *m = needle_model_load_buffer(data, len);
    if (!m) {
        snprintf(why, why_len, "%s", needle_thread_error());
        return -1;
    }
    swap_in(m, name);
    return 0;
}

int pg_slot_load_path(const char *path, const char *name, char *why, size_t why_len)
{
    needle_model *m = needle_model_load(path);
    if (!m) {
        snprintf(why, why_len, "%s", needle_thread_error());
        return -1;
    }
    swap_in(m, name);
    return 0;
}

char *pg_slot_info_json(void)
{
    pthread_mutex_lock(&slot_lock);
    json_t *o = json_pack("{s:s, s:b, s:i}", "name", slot_name, "loaded", slot_model != NULL,
                          "max_seq_len", slot_model ? needle_model_max_seq_len(slot_model) : 0);
    pthread_mutex_unlock(&slot_lock);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static char *error_json(const char *msg)
{
    json_t *o = json_pack("{s:b, s:s}", "success", 0, "error", msg);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

char *pg_slot_complete(const char *tools_json, const char *query, int require_call,
                       int *http_status)
{
    *http_status = 200;
    pthread_mutex_lock(&slot_lock);
    char *out = NULL;
    if (!slot_model) {
        *http_status = 400;
        out = error_json("no model loaded: upload a .cact or start with --weights");
        goto done;
    }
    if (slot_session && slot_tools && !strcmp(slot_tools, tools_json)) {
        needle_session_reset(slot_session);
    } else {
        drop_session_locked();
        slot_session = needle_session_new(slot_model, NULL, tools_json);
        if (!slot_session) {
            *http_status = 400;
            out = error_json(needle_thread_error());
            goto done;
        }
        slot_tools = strdup(tools_json);
    }
    needle_session_require_call(slot_session, require_call);
    /* the envelope grows with the reasoning and calls: retry larger */
    for (int cap = 1 << 16; cap <= 1 << 24; cap *= 4) {
        char *buf = malloc((size_t)cap);
        if (!buf)
            break;
        int rc = needle_session_complete(slot_session, query, slot_max_new, buf, cap);
        if (rc == NEEDLE_EBUFFER) {
            free(buf);
            continue;
        }
        if (rc < 0 && !buf[0]) {
            free(buf);
            out = error_json(needle_session_error(slot_session));
        } else {
            out = buf;
        }
        break;
    }
    if (!out)
        out = error_json("out of memory");
done:
    pthread_mutex_unlock(&slot_lock);
    return out;
}

void pg_slot_reset(void)
{
    pthread_mutex_lock(&slot_lock);
    drop_session_locked();
    pthread_mutex_unlock(&slot_lock);
}

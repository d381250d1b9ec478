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
#include "cli/playground/request_check.h"
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

static char *error_json(const char *msg, json_t *warnings)
{
    json_t *o = json_pack("{s:b, s:s}", "success", 0, "error", msg);
    if (o && warnings && json_array_size(warnings))
        json_object_set(o, "warnings", warnings);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

/* The session's schema warnings as an array of lines; *unsat: the first
 * one that reports a constraint no value meets (NULL if none). */
static json_t *session_warnings(const needle_session *s, const char **unsat)
{
    json_t *arr = json_array();
    const char *p = needle_session_warnings(s);
    *unsat = NULL;
    while (arr && *p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        json_t *line = json_stringn(p, n);
        if (line) {
            if (!*unsat && pg_warning_unsatisfiable(json_string_value(line)))
                *unsat = json_string_value(line);
            json_array_append_new(arr, line);
        }
        p += n + (e ? 1 : 0);
    }
    return arr;
}

/* The envelope with "warnings": [...] added (the envelope as is when
 * there are none, or when it is not a JSON object). Takes env. */
static char *with_warnings(char *env, json_t *warnings)
{
    if (!env || !json_array_size(warnings))
        return env;
    json_t *o = json_loads(env, 0, NULL);
    char *s = NULL;
    if (json_is_object(o) && !json_object_set(o, "warnings", warnings))
        s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s)
        return env;
    free(env);
    return s;
}

char *pg_slot_complete(const char *tools_json, const char *query, int require_call,
                       int *http_status)
{
    *http_status = 200;
    pthread_mutex_lock(&slot_lock);
    char *out = NULL;
    json_t *warnings = NULL;
    if (!slot_model) {
        *http_status = 400;
        out = error_json("no model loaded: upload a .cact or start with --weights", NULL);
        goto done;
    }
    if (slot_session && slot_tools && !strcmp(slot_tools, tools_json)) {
        needle_session_reset(slot_session);
    } else {
        drop_session_locked();
        slot_session = needle_session_new(slot_model, NULL, tools_json);
        if (!slot_session) {
            *http_status = 400;
            out = error_json(needle_thread_error(), NULL);
            goto done;
        }
        slot_tools = strdup(tools_json);
    }
    /* the compiler drops a constraint no value meets (and warns), so the
     * model would be free to break it: refuse such a schema instead */
    const char *unsat;
    warnings = session_warnings(slot_session, &unsat);
    if (unsat) {
        char msg[1024];
        snprintf(msg, sizeof msg,
                 "tools: %s: no value satisfies this schema (at the tool and JSON path named "
                 "first); fix the schema",
                 unsat);
        *http_status = 400;
        out = error_json(msg, warnings);
        drop_session_locked();
        goto done;
    }
    needle_session_require_call(slot_session, require_call);
    /* the envelope grows with the reasoning and calls: retry larger */
    for (int cap = 1 << 16; cap <= 1 << 24; cap *= 4) {
        char *buf = malloc((size_t)cap);
        if (!buf)
            break;
        int rc = needle_session_complete(slot_session, query, slot_max_new, buf, cap);
        /* with this query's note (retrieved tools left out to fit) */
        json_decref(warnings);
        warnings = session_warnings(slot_session, &unsat);
        if (rc == NEEDLE_EBUFFER) {
            free(buf);
            continue;
        }
        if (rc < 0 && !buf[0]) {
            free(buf);
            out = error_json(needle_session_error(slot_session), warnings);
        } else {
            out = with_warnings(buf, warnings);
        }
        break;
    }
    if (!out)
        out = error_json("out of memory", NULL);
done:
    json_decref(warnings);
    pthread_mutex_unlock(&slot_lock);
    return out;
}

void pg_slot_reset(void)
{
    pthread_mutex_lock(&slot_lock);
    drop_session_locked();
    pthread_mutex_unlock(&slot_lock);
}

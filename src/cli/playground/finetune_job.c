/* The playground's fine-tune: write the examples, then run our own binary
 * as `needle finetune` and `needle build` child processes, parse their
 * output lines into the status object, and hot-load the built archive.
 * One job at a time; every file it writes lives in the work directory and
 * only those names are ever served. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/playground/playground.h"
#include "train/finetune.h"
#include "train/recommend.h"

extern char **environ;

#define LOG_LINES 100

static const char *const produced_names[] = {
    "needle_playground_data.jsonl",
    "needle_playground_lora.pkl",
    "needle_tuned.cact",
};

static struct pg_job_config job_cfg;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t job_thread;
static int job_thread_live; /* a thread to join */
static int job_running;
static int job_stopping;
static pid_t job_child;
static char job_step[64] = "";
static char *job_log[LOG_LINES];
static int job_log_n;
static char job_checkpoint[128];
static char job_error[1024];
static int job_done_steps, job_total_steps;
static int job_epochs;
static int job_batch, job_max_len;
static double job_lr;
static int job_samples; /* > 0: generate the examples first */
static char *job_api_key;

static void log_line_locked(const char *s)
{
    if (job_log_n == LOG_LINES) {
        free(job_log[0]);
        memmove(job_log, job_log + 1, sizeof job_log[0] * (LOG_LINES - 1));
        job_log_n--;
    }
    job_log[job_log_n++] = strdup(s);
}

static void set_step(const char *step)
{
    pthread_mutex_lock(&job_lock);
    snprintf(job_step, sizeof job_step, "%s", step);
    pthread_mutex_unlock(&job_lock);
}

static void path_in_workdir(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", job_cfg.workdir, name);
}

void pg_job_configure(const struct pg_job_config *cfg)
{
    job_cfg = *cfg;
}

int pg_job_produced(const char *name)
{
    for (size_t i = 0; i < sizeof produced_names / sizeof produced_names[0]; i++)
        if (!strcmp(name, produced_names[i])) {
            char p[4096];
            struct stat st;
            path_in_workdir(p, sizeof p, name);
            return stat(p, &st) == 0 && S_ISREG(st.st_mode);
        }
    return 0;
}

/* "  step      3/12  loss 2.1" -> progress; every line -> the log. */
static void take_line(char *line)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = 0;
    if (!n)
        return;
    int done, total;
    const char *p = line;
    while (*p == ' ')
        p++;
    pthread_mutex_lock(&job_lock);
    if (!strncmp(p, "step", 4) && sscanf(p + 4, " %d/%d", &done, &total) == 2) {
        job_done_steps = done;
        job_total_steps = total;
    }
    log_line_locked(line);
    pthread_mutex_unlock(&job_lock);
}

/* Our environment with OPENROUTER_API_KEY replaced by `key` (NULL: as
 * is). The key goes to the child only: never logged or written. */
static char **child_env(const char *key, char **owned)
{
    *owned = NULL;
    if (!key)
        return environ;
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof *env);
    size_t len = strlen("OPENROUTER_API_KEY=") + strlen(key) + 1;
    char *entry = malloc(len);
    if (!env || !entry) {
        free(env);
        free(entry);
        return NULL;
    }
    snprintf(entry, len, "OPENROUTER_API_KEY=%s", key);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "OPENROUTER_API_KEY=", 19))
            env[k++] = environ[i];
    env[k++] = entry;
    *owned = entry;
    return env;
}

/* Run `self_exe argv...` with stdout+stderr piped into the log (and the
 * API key in its environment when key is set). 0 when it exits 0, else
 * fills job_error. */
static int run_child(char *const argv[], const char *key)
{
    char *key_entry;
    char **envp = child_env(key, &key_entry);
    if (!envp) {
        snprintf(job_error, sizeof job_error, "out of memory");
        return -1;
    }
    int fds[2];
    if (pipe(fds)) {
        snprintf(job_error, sizeof job_error, "pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    /* the server blocks SIGINT/SIGTERM in its threads: the child must not
     * inherit that, or its own stop handling would never run */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, deflt;
    sigemptyset(&none);
    sigemptyset(&deflt);
    sigaddset(&deflt, SIGINT);
    sigaddset(&deflt, SIGTERM);
    sigaddset(&deflt, SIGPIPE);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &deflt);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    pthread_mutex_lock(&job_lock);
    int rc = job_stopping ? ECANCELED : posix_spawn(&pid, job_cfg.self_exe, &fa, &attr, argv, envp);
    if (!rc)
        job_child = pid;
    pthread_mutex_unlock(&job_lock);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (key_entry) {
        memset(key_entry, 0, strlen(key_entry));
        free(key_entry);
        free(envp);
    }
    close(fds[1]);
    if (rc) {
        close(fds[0]);
        snprintf(job_error, sizeof job_error, "cannot start %s %s: %s", job_cfg.self_exe, argv[1],
                 strerror(rc));
        return -1;
    }
    FILE *f = fdopen(fds[0], "r");
    char line[2048];
    while (f && fgets(line, sizeof line, f))
        take_line(line);
    if (f)
        fclose(f);
    else
        close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&job_lock);
    job_child = 0;
    pthread_mutex_unlock(&job_lock);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status))
        snprintf(job_error, sizeof job_error, "needle %s exited with status %d (see log)", argv[1],
                 WEXITSTATUS(status));
    else
        snprintf(job_error, sizeof job_error, "needle %s was killed by signal %d", argv[1],
                 WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return -1;
}

static void *job_main(void *arg)
{
    (void)arg;
    char data[4096], adapter[4096], out[4096];
    path_in_workdir(data, sizeof data, produced_names[0]);
    path_in_workdir(adapter, sizeof adapter, produced_names[1]);
    path_in_workdir(out, sizeof out, produced_names[2]);
    char epochs[32], batch[32], lr[64], max_len[32];
    snprintf(epochs, sizeof epochs, "%d", job_epochs);
    snprintf(batch, sizeof batch, "%d", job_batch);
    snprintf(lr, sizeof lr, "%.17g", job_lr);
    snprintf(max_len, sizeof max_len, "%d", job_max_len);

    int rc = 0;
    if (job_samples > 0) {
        char tools[4096], samples[32];
        path_in_workdir(tools, sizeof tools, "needle_playground_tools.json");
        snprintf(samples, sizeof samples, "%d", job_samples);
        set_step("generating data");
        char *gen[] = {"needle", "generate-data", "--tools", tools, "--num-samples",
                       samples,  "--output",      data,      NULL};
        rc = run_child(gen, job_api_key);
    }
    if (!rc) {
        set_step("training");
        char *ft[] = {"needle",
                      "finetune",
                      data,
                      "--checkpoint",
                      (char *)job_cfg.base,
                      "--tokenizer",
                      (char *)job_cfg.tokenizer,
                      "--epochs",
                      epochs,
                      "--batch-size",
                      batch,
                      "--lr",
                      lr,
                      "--max-len",
                      max_len,
                      "--out",
                      adapter,
                      NULL};
        rc = run_child(ft, NULL);
    }
    if (!rc) {
        set_step("building");
        char *build[] = {"needle", "build",       "--lora",
                         adapter,  "--tokenizer", (char *)job_cfg.tokenizer,
                         "--out",  out,           (char *)job_cfg.base,
                         NULL};
        rc = run_child(build, NULL);
    }
    if (!rc) {
        set_step("loading");
        char why[512];
        if (pg_slot_load_path(out, produced_names[2], why, sizeof why)) {
            snprintf(job_error, sizeof job_error, "built archive does not load: %s", why);
            rc = -1;
        }
    }
    pthread_mutex_lock(&job_lock);
    job_running = 0;
    if (job_api_key) {
        memset(job_api_key, 0, strlen(job_api_key));
        free(job_api_key);
        job_api_key = NULL;
    }
    if (!rc) {
        snprintf(job_step, sizeof job_step, "done");
        snprintf(job_checkpoint, sizeof job_checkpoint, "%s", produced_names[2]);
    } else {
        snprintf(job_step, sizeof job_step, "failed");
        log_line_locked(job_error);
    }
    pthread_mutex_unlock(&job_lock);
    return NULL;
}

/* Check the examples (each non-blank line a JSON object) and write them
 * atomically. */
static int write_examples(const char *jsonl, char *why, size_t why_len)
{
    int line_no = 0, examples = 0;
    const char *p = jsonl;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        line_no++;
        int blank = 1;
        for (size_t i = 0; i < n; i++)
            if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
                blank = 0;
        if (!blank) {
            json_error_t err;
            json_t *v = json_loadb(p, n, 0, &err);
            int ok = v && json_is_object(v);
            json_decref(v);
            if (!ok) {
                snprintf(why, why_len, "examples line %d: %s", line_no,
                         v ? "not a JSON object" : err.text);
                return -1;
            }
            examples++;
        }
        p += n + (e != NULL);
    }
    if (!examples) {
        snprintf(why, why_len, "examples: no JSONL lines given");
        return -1;
    }
    char path[4096], tmp[4200];
    path_in_workdir(path, sizeof path, produced_names[0]);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fputs(jsonl, f) < 0 ||
        (jsonl[0] && jsonl[strlen(jsonl) - 1] != '\n' && fputc('\n', f) == EOF)) {
        snprintf(why, why_len, "%s: %s", tmp, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    if (fclose(f) || rename(tmp, path)) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The tools the generator writes examples for, atomically. */
static int write_tools(const char *tools_json, char *why, size_t why_len)
{
    char path[4096], tmp[4200];
    path_in_workdir(path, sizeof path, "needle_playground_tools.json");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(why, why_len, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    int bad = fputs(tools_json, f) < 0;
    if (fclose(f) || bad || rename(tmp, path)) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* `needle finetune`'s defaults with the base's recommendation over them;
 * from[i]: 1 where the base recommends setting i */
static void base_settings(nd_recommend *out, int from[ND_REC_N])
{
    nd_finetune_opts o;
    nd_finetune_defaults(&o);
    const double dflt[ND_REC_N] = {[ND_REC_LR] = o.lr,
                                   [ND_REC_LORA_RANK] = o.rank,
                                   [ND_REC_LORA_ALPHA] = o.alpha,
                                   [ND_REC_EPOCHS] = o.epochs,
                                   [ND_REC_BATCH_SIZE] = o.batch_size};
    /* read once: the base does not change while the server runs (and
     * needle2.pkl is large) */
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    static int have;
    static nd_recommend rec;
    pthread_mutex_lock(&once);
    if (!have) {
        memset(&rec, 0, sizeof rec);
        if (!job_cfg.base || nd_recommend_read(job_cfg.base, &rec))
            memset(&rec, 0, sizeof rec); /* unreadable: finetune will say why */
        have = 1;
    }
    pthread_mutex_unlock(&once);
    for (int i = 0; i < ND_REC_N; i++) {
        from[i] = rec.has[i];
        out->has[i] = 1;
        out->value[i] = rec.has[i] ? rec.value[i] : dflt[i];
    }
}

char *pg_job_defaults_json(void)
{
    nd_recommend r;
    int from[ND_REC_N];
    base_settings(&r, from);
    json_t *o = json_object(), *src = json_object();
    for (int i = 0; o && src && i < ND_REC_N; i++) {
        const char *k = nd_recommend_key(i);
        json_object_set_new(o, k,
                            i == ND_REC_LR || i == ND_REC_LORA_ALPHA
                                ? json_real(r.value[i])
                                : json_integer((json_int_t)r.value[i]));
        json_object_set_new(src, k, json_string(from[i] ? "base" : "finetune default"));
    }
    json_object_set_new(o, "base", job_cfg.base ? json_string(job_cfg.base) : json_null());
    json_object_set_new(o, "source", src);
    char *out = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return out;
}

int pg_job_start(const char *jsonl, const char *tools_json, const char *api_key, int samples,
                 int epochs, int batch_size, double lr, int max_len, char *why, size_t why_len)
{
    if (epochs <= 0 || batch_size <= 0 || !(lr > 0)) { /* the form left them to the base */
        nd_recommend r;
        int from[ND_REC_N];
        base_settings(&r, from);
        epochs = epochs > 0 ? epochs : (int)r.value[ND_REC_EPOCHS];
        batch_size = batch_size > 0 ? batch_size : (int)r.value[ND_REC_BATCH_SIZE];
        lr = lr > 0 ? lr : r.value[ND_REC_LR];
    }
    pthread_mutex_lock(&job_lock);
    if (job_running) {
        pthread_mutex_unlock(&job_lock);
        snprintf(why, why_len, "a finetune is already running");
        return 409;
    }
    int code = 400;
    struct stat st;
    if (job_stopping) {
        snprintf(why, why_len, "the playground is shutting down");
        code = 503;
        goto out;
    }
    if (!job_cfg.base || stat(job_cfg.base, &st) || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "base checkpoint %s not found (start with --base CKPT.pkl)",
                 job_cfg.base ? job_cfg.base : "(none)");
        goto out;
    }
    if (!job_cfg.tokenizer) {
        snprintf(why, why_len, "no tokenizer (start with --tokenizer FILE)");
        goto out;
    }
    if (jsonl ? write_examples(jsonl, why, why_len) : write_tools(tools_json, why, why_len))
        goto out;
    if (job_thread_live) {
        pthread_join(job_thread, NULL); /* the finished previous job */
        job_thread_live = 0;
    }
    for (int i = 0; i < job_log_n; i++)
        free(job_log[i]);
    job_log_n = 0;
    job_checkpoint[0] = job_error[0] = 0;
    job_done_steps = job_total_steps = 0;
    job_epochs = epochs;
    job_batch = batch_size;
    job_lr = lr;
    job_max_len = max_len;
    job_samples = jsonl ? 0 : samples;
    job_api_key = jsonl ? NULL : strdup(api_key);
    snprintf(job_step, sizeof job_step, "starting");
    job_running = 1;
    if (pthread_create(&job_thread, NULL, job_main, NULL)) {
        job_running = 0;
        snprintf(why, why_len, "cannot start the fine-tune thread");
        code = 500;
        goto out;
    }
    job_thread_live = 1;
    code = 0;
out:
    pthread_mutex_unlock(&job_lock);
    return code;
}

char *pg_job_status_json(void)
{
    pthread_mutex_lock(&job_lock);
    json_t *log = json_array();
    for (int i = 0; i < job_log_n; i++)
        json_array_append_new(log, json_string(job_log[i]));
    json_t *o = json_pack("{s:b, s:s, s:o, s:o, s:o, s:{s:i, s:i}}", "running", job_running, "step",
                          job_step, "log", log, "checkpoint",
                          job_checkpoint[0] ? json_string(job_checkpoint) : json_null(), "error",
                          !job_running && job_error[0] ? json_string(job_error) : json_null(),
                          "progress", "done", job_done_steps, "total", job_total_steps);
    pthread_mutex_unlock(&job_lock);
    json_t *dl = json_array();
    for (size_t i = 0; i < sizeof produced_names / sizeof produced_names[0]; i++)
        if (pg_job_produced(produced_names[i]))
            json_array_append_new(dl, json_string(produced_names[i]));
    json_object_set_new(o, "downloads", dl);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

void pg_job_shutdown(void)
{
    pthread_mutex_lock(&job_lock);
    job_stopping = 1;
    if (job_child > 0)
        kill(job_child, SIGTERM);
    int live = job_thread_live;
    job_thread_live = 0;
    pthread_mutex_unlock(&job_lock);
    if (live)
        pthread_join(job_thread, NULL);
    for (int i = 0; i < job_log_n; i++)
        free(job_log[i]);
    job_log_n = 0;
}

/* `needle --man` and `needle --completion bash`: the man page needle.1 and
 * the bash completion script, made from the same option tables that parse
 * the commands (opts.h). Each command is asked for its --help with
 * cli_opts_describe set, which hands over its table instead of printing;
 * a command not yet on the tables prints its help as text, captured here
 * (man: shown as it is; completion: the --options it names). */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"

typedef struct {
    char word[32]; /* the command ("run") */
    cli_cmd cmd;   /* a copy of its table (strings are the command's literals) */
    cli_opt *opts; /* NULL: `text` is its plain --help */
    char *text;
    char label[64]; /* a plain help's form: "bench decode" */
} gen_entry;

static gen_entry *entries;
static size_t n_entries;

static void describe(const cli_cmd *c)
{
    gen_entry *e = &entries[n_entries - 1];
    e->cmd = *c;
    e->opts = malloc(c->n_opts * sizeof *e->opts + 1);
    if (e->opts)
        memcpy(e->opts, c->opts, c->n_opts * sizeof *e->opts);
    e->cmd.opts = e->opts;
}

/* Each command's (and sub-form's) table, or its help text. */
static const char *const extra_forms[][4] = {
    {"run", "--checkpoint", "X.pkl", "--help"},
    {"bench", "decode", "--help", NULL},
    {"bench", "finetune", "--help", NULL},
};

static int collect_one(const cli_command *cmd, char **argv, int argc)
{
    gen_entry *grown = realloc(entries, (n_entries + 1) * sizeof *entries);
    if (!grown)
        return 1;
    entries = grown;
    gen_entry *e = &entries[n_entries++];
    memset(e, 0, sizeof *e);
    snprintf(e->word, sizeof e->word, "%s", cmd->name);
    /* plain help lands in a temporary file in place of stdout */
    FILE *tmp = tmpfile();
    if (!tmp)
        return 1;
    fflush(stdout);
    int saved = dup(1);
    if (saved < 0 || dup2(fileno(tmp), 1) < 0) {
        fclose(tmp);
        return 1;
    }
    cli_opts_describe = describe;
    int rc = cmd->fn(argc, argv);
    cli_opts_describe = NULL;
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    if (rc != 0) {
        fclose(tmp);
        fprintf(stderr, "needle: `needle %s --help` exited %d\n", cmd->name, rc);
        return 1;
    }
    if (!e->opts) {
        long n = ftell(tmp);
        rewind(tmp);
        e->text = malloc(n > 0 ? (size_t)n + 1 : 1);
        if (!e->text || (n > 0 && fread(e->text, 1, (size_t)n, tmp) != (size_t)n)) {
            fclose(tmp);
            return 1;
        }
        e->text[n > 0 ? n : 0] = 0;
        for (int i = 0; i < argc; i++)
            if (strcmp(argv[i], "--help"))
                snprintf(e->label + strlen(e->label), sizeof e->label - strlen(e->label), "%s%s",
                         i ? " " : "", argv[i]);
    }
    fclose(tmp);
    return 0;
}

static void free_entries(void)
{
    for (size_t i = 0; i < n_entries; i++) {
        free(entries[i].opts);
        free(entries[i].text);
    }
    free(entries);
    entries = NULL;
    n_entries = 0;
}

static int collect(const cli_command *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *argv[] = {(char *)cmds[i].name, "--help", NULL};
        if (collect_one(&cmds[i], argv, 2))
            return 1;
        for (size_t k = 0; k < sizeof extra_forms / sizeof extra_forms[0]; k++) {
            if (strcmp(extra_forms[k][0], cmds[i].name))
                continue;
            char *xargv[4];
            int xargc = 0;
            for (int j = 0; j < 4 && extra_forms[k][j]; j++)
                xargv[xargc++] = (char *)extra_forms[k][j];
            if (collect_one(&cmds[i], xargv, xargc))
                return 1;
        }
    }
    return 0;
}

/* ---- man page ---- */

/* roff-escape a line of text: backslashes, dashes, a leading '.' or '\'' */
static void roff_text(FILE *f, const char *s, size_t n)
{
    if (n && (s[0] == '.' || s[0] == '\''))
        fputs("\\&", f);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\')
            fputs("\\e", f);
        else if (s[i] == '-')
            fputs("\\-", f);
        else
            fputc(s[i], f);
    }
}

/* Text with its line breaks kept (usage lines, plain help). */
static void roff_block(FILE *f, const char *text)
{
    fputs(".nf\n", f);
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        roff_text(f, p, n);
        fputc('\n', f);
        p += n + (p[n] == '\n');
    }
    fputs(".fi\n", f);
}

/* Paragraphs: a blank line starts a new one; indented lines keep their breaks. */
static void roff_paragraphs(FILE *f, const char *text)
{
    fputs(".PP\n", f);
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        if (n == 0)
            fputs(".PP\n", f);
        else {
            if (p[0] == ' ')
                fputs(".br\n", f);
            roff_text(f, p, n);
            fputc('\n', f);
        }
        p += n + (p[n] == '\n');
    }
}

static void man_entry(FILE *f, const gen_entry *e)
{
    const cli_cmd *c = &e->cmd;
    fputs(".SS \"", f);
    roff_text(f, "needle ", 7);
    const char *name = e->opts ? c->name : e->label;
    roff_text(f, name, strlen(name));
    fputs("\"\n", f);
    if (!e->opts) {
        roff_block(f, e->text);
        return;
    }
    roff_block(f, c->usage);
    if (c->about && *c->about)
        roff_paragraphs(f, c->about);
    for (size_t i = 0; i < c->n_opts; i++) {
        const cli_opt *o = &c->opts[i];
        fputs(".TP\n.B ", f);
        roff_text(f, o->name, strlen(o->name));
        if (o->kind != CLI_FLAG) {
            fputs(" \\fI", f);
            roff_text(f, o->arg, strlen(o->arg));
            fputs("\\fR", f);
        }
        fputc('\n', f);
        for (const char *p = o->help; *p;) {
            size_t n = strcspn(p, "\n");
            roff_text(f, p, n);
            fputc('\n', f);
            p += n + (p[n] == '\n');
            if (*p)
                fputs(".br\n", f);
        }
    }
    if (c->epilog)
        roff_paragraphs(f, c->epilog);
}

int cli_gen_man(FILE *f, const cli_command *cmds, size_t n)
{
    if (collect(cmds, n)) {
        free_entries();
        return 1;
    }
    fprintf(f, ".\\\" needle.1: generated by `needle --man` from the option tables; do not edit\n");
    fprintf(f, ".TH NEEDLE 1 \"\" \"needle %s\" \"User Commands\"\n", NEEDLE_VERSION_STRING);
    fputs(".SH NAME\nneedle \\- train, quantise and run Needle tool-calling models\n", f);
    fputs(".SH SYNOPSIS\n.B needle\n.I command\n[\\fIoptions\\fR]\n.br\n.B needle\n"
          ".I command\n.B \\-\\-help\n",
          f);
    fputs(".SH DESCRIPTION\nA bare\n.B needle\nlists the commands;\n.BI \"needle \" command "
          "\" \\-\\-help\"\ndescribes one (the same text as below). Errors exit 1, usage errors "
          "2; an option's value may follow it or be joined with\n.BR = .\n",
          f);
    fputs(".SH COMMANDS\n", f);
    for (size_t i = 0; i < n; i++) {
        fputs(".TP\n.B ", f);
        roff_text(f, cmds[i].name, strlen(cmds[i].name));
        fputc('\n', f);
        roff_text(f, cmds[i].help, strlen(cmds[i].help));
        fputc('\n', f);
    }
    fputs(".SH OPTIONS\n", f);
    for (size_t i = 0; i < n_entries; i++)
        man_entry(f, &entries[i]);
    fputs(".SH ENVIRONMENT\n.TP\n.B NEEDLE_TOKENIZER\nthe tokenizer when --tokenizer is not "
          "given\n.TP\n.B OMP_NUM_THREADS\nthreads when --threads is not given\n"
          ".SH SEE ALSO\ndocs/cli.md in the source tree\n",
          f);
    free_entries();
    return ferror(f) ? 1 : 0;
}

/* ---- bash completion ---- */

/* the --options a plain help text names (a command not on the tables) */
static void scrape_options(FILE *f, const char *text)
{
    for (const char *p = text; (p = strstr(p, "--"));) {
        const char *q = p + 2;
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '-')) {
            p = q;
            continue;
        }
        while (isalnum((unsigned char)*q) || *q == '-')
            q++;
        if (q - p > 2 && isalpha((unsigned char)p[2]))
            fprintf(f, " %.*s", (int)(q - p), p);
        p = q;
    }
}

static void words_of(FILE *f, const char *choices)
{
    for (const char *p = choices; *p; p++)
        fputc(*p == '|' ? ' ' : *p, f);
}

int cli_gen_completion(FILE *f, const cli_command *cmds, size_t n)
{
    if (collect(cmds, n)) {
        free_entries();
        return 1;
    }
    fputs("# bash completion for needle: generated by `needle --completion bash` from the\n"
          "# option tables that parse the commands; do not edit.\n\n",
          f);
    fputs("# the options of command $1\n_needle_options()\n{\n    case \"$1\" in\n", f);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "    %s) echo \"", cmds[i].name);
        for (size_t k = 0; k < n_entries; k++) {
            const gen_entry *e = &entries[k];
            if (strcmp(e->word, cmds[i].name))
                continue;
            if (!e->opts) {
                scrape_options(f, e->text);
                continue;
            }
            for (size_t j = 0; j < e->cmd.n_opts; j++) {
                fprintf(f, " %s", e->opts[j].name);
            }
        }
        fputs("\" ;;\n", f);
    }
    fputs("    esac\n}\n\n", f);
    fputs("# what follows option $2 of command $1: -file, -dir, -none (a value to type),\n"
          "# words to choose from, or nothing (a flag)\n"
          "_needle_value()\n{\n    case \"$1 $2\" in\n",
          f);
    for (size_t k = 0; k < n_entries; k++) {
        const gen_entry *e = &entries[k];
        if (!e->opts)
            continue;
        for (size_t j = 0; j < e->cmd.n_opts; j++) {
            const cli_opt *o = &e->opts[j];
            if (o->kind == CLI_FLAG)
                continue;
            fprintf(f, "    \"%s %s\") echo \"", e->word, o->name);
            if (o->choices) {
                words_of(f, o->choices);
            } else if (o->kind == CLI_PATH)
                fputs("-file", f);
            else if (o->kind == CLI_DIR)
                fputs("-dir", f);
            else
                fputs("-none", f);
            fputs("\" ;;\n", f);
        }
    }
    fputs("    *) echo \"-unknown\" ;;\n    esac\n}\n\n", f);
    fputs("_needle()\n{\n"
          "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
          "    COMPREPLY=()\n"
          "    if [ \"$COMP_CWORD\" -eq 1 ]; then\n"
          "        COMPREPLY=($(compgen -W \"",
          f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%s", i ? " " : "", cmds[i].name);
    fputs(" --help --version\" -- \"$cur\"))\n"
          "        return\n"
          "    fi\n"
          "    local cmd=${COMP_WORDS[1]}\n"
          "    if [ \"$COMP_CWORD\" -gt 2 ] && [[ $prev == --* ]]; then\n"
          "        local v\n"
          "        v=$(_needle_value \"$cmd\" \"$prev\")\n"
          "        case \"$v\" in\n"
          "        -file) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
          "        -dir) COMPREPLY=($(compgen -d -- \"$cur\")); return ;;\n"
          "        -none) return ;;\n"
          "        -unknown) ;;\n"
          "        ?*) COMPREPLY=($(compgen -W \"$v\" -- \"$cur\")); return ;;\n"
          "        esac\n"
          "    fi\n"
          "    if [[ $cur == -* ]]; then\n"
          "        COMPREPLY=($(compgen -W \"$(_needle_options \"$cmd\") --help\" -- \"$cur\"))\n"
          "    else\n"
          "        COMPREPLY=($(compgen -f -- \"$cur\"))\n"
          "    fi\n"
          "}\n"
          "complete -o filenames -o bashdefault -F _needle needle\n",
          f);
    free_entries();
    return ferror(f) ? 1 : 0;
}

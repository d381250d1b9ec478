/* Declarative command-line options: one table per command, from which come
 * the parsing (with range checks and errors naming the option and the bad
 * value), the --help text, the man page section and the bash completion.
 *
 * A command fills a cli_cmd (its name, usage lines, the text before and
 * after the option list) and an array of cli_opt whose targets point at its
 * own variables, then calls cli_opts_parse. Arguments not starting with
 * "--" are positional (collected in cmd.pos); `--name VALUE` and
 * `--name=VALUE` both work; the last of a repeated option wins. */
#ifndef ND_CLI_OPTS_H
#define ND_CLI_OPTS_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    CLI_FLAG,  /* no value: *(int *)target = 1 */
    CLI_INT,   /* *(int *)target, integer in [lo, hi] */
    CLI_I64,   /* *(long long *)target, integer in [lo, hi] */
    CLI_FLOAT, /* *(double *)target, finite, in the range (flags say open ends) */
    CLI_STR,   /* *(const char **)target; `choices` only hint the completion */
    CLI_PATH,  /* *(const char **)target, a file (completed as one) */
    CLI_DIR,   /* *(const char **)target, a directory */
    CLI_ENUM,  /* *(const char **)target, one of `choices` ("a|b|c") */
    CLI_LIST,  /* (cli_strlist *)target: each use adds one value (repeatable) */
} cli_kind;

#define CLI_LIST_MAX 16
typedef struct {
    const char *v[CLI_LIST_MAX];
    size_t n;
} cli_strlist;

enum {
    CLI_LO_OPEN = 1, /* FLOAT: value > lo (not >=) */
    CLI_HI_OPEN = 2, /* FLOAT: value < hi */
    CLI_NO_HI = 4,   /* FLOAT: no upper bound */
    CLI_NO_LO = 8,   /* FLOAT: no lower bound */
};

typedef struct {
    const char *name;    /* "--threads" */
    cli_kind kind;       /* what the value is */
    void *target;        /* where the value goes (see cli_kind) */
    double lo, hi;       /* INT/I64/FLOAT range */
    const char *arg;     /* the value's name in the help ("N", "PATH") */
    const char *choices; /* ENUM: the values, '|'-separated; STR: completion words */
    const char *help;    /* one paragraph, wrapped when printed */
    int flags;           /* CLI_LO_OPEN ... */
    int given;           /* set by cli_opts_parse: times the option was seen */
} cli_opt;

#define CLI_MAX_POS 16

typedef struct {
    const char *name;   /* "finetune", or "run --checkpoint" for a sub-form */
    const char *usage;  /* "usage: needle ..." lines, printed as they are */
    const char *about;  /* text between the usage and the options ("" for none) */
    const char *epilog; /* text after the options (NULL for none) */
    cli_opt *opts;
    size_t n_opts;
    int max_pos; /* positionals accepted (more: "unexpected argument") */
    /* filled by cli_opts_parse */
    const char *pos[CLI_MAX_POS];
    int n_pos;
} cli_cmd;

#define CLI_NOPTS(a) (sizeof(a) / sizeof((a)[0]))

/* The groups several commands share, defined once. */
#define CLI_THREADS_HELP "worker threads (default: all cores)"
#define CLI_OPT_THREADS(p)                                                                         \
    {                                                                                              \
        "--threads", CLI_I64, (p), 1, 1024, "N", NULL, CLI_THREADS_HELP, 0, 0                      \
    }
#define CLI_DEVICE_CHOICES "auto cpu cuda vulkan"
#define CLI_DEVICE_HELP                                                                            \
    "auto|cpu|cuda[:N]|vulkan[:N] (default auto: CUDA, else a Vulkan GPU, else the CPU; software " \
    "Vulkan such as lavapipe only as vulkan:N)"
#define CLI_OPT_DEVICE(p, help)                                                                    \
    {                                                                                              \
        "--device", CLI_STR, (p), 0, 0, "D", CLI_DEVICE_CHOICES, (help), 0, 0                      \
    }
#define CLI_PRECISION_HELP                                                                         \
    "fp32|tf32|bf16: the CUDA backend's GEMMs (default fp32; tf32 and bf16 use tensor cores with " \
    "float32 sums)"
#define CLI_OPT_PRECISION(p)                                                                       \
    {                                                                                              \
        "--precision", CLI_STR, (p), 0, 0, "P", "fp32 tf32 bf16", CLI_PRECISION_HELP, 0, 0         \
    }
#define CLI_TOKENIZER_HELP                                                                         \
    "SentencePiece model (default $NEEDLE_TOKENIZER, else tokenizer.model beside the checkpoint)"
#define CLI_OPT_TOKENIZER(p, help)                                                                 \
    {                                                                                              \
        "--tokenizer", CLI_PATH, (p), 0, 0, "PATH", NULL, (help), 0, 0                             \
    }
#define CLI_OPT_CHECKPOINT(p, help)                                                                \
    {                                                                                              \
        "--checkpoint", CLI_PATH, (p), 0, 0, "PATH", NULL, (help), 0, 0                            \
    }

/* Parse argv[1..argc-1] (argv[0] is the command's name). Returns 0 to go
 * on, -1 after printing --help (the command then exits 0), or 2 after
 * printing a usage error naming the option and the bad value. */
int cli_opts_parse(cli_cmd *c, int argc, char **argv);
/* CLI_PARSE(&cmd, argc, argv): parse, or return from the calling command. */
#define CLI_PARSE(c, argc, argv)                                                                   \
    do {                                                                                           \
        int cli_parse_rc_ = cli_opts_parse((c), (argc), (argv));                                   \
        if (cli_parse_rc_)                                                                         \
            return cli_parse_rc_ < 0 ? 0 : cli_parse_rc_;                                          \
    } while (0)

/* The option `name` of c (NULL if none) and whether it was given. */
cli_opt *cli_opts_find(const cli_cmd *c, const char *name);
int cli_opts_given(const cli_cmd *c, const char *name);

/* The command's --help text. */
void cli_opts_help(const cli_cmd *c, FILE *f);

/* Where --help goes instead of being printed: `needle --man` and
 * `needle --completion bash` collect every command's table this way. */
extern void (*cli_opts_describe)(const cli_cmd *c);

/* `needle --man` (a roff man page, needle.1) and `needle --completion bash`
 * (main.c's hidden commands); 0, or 1 after printing the error. */
typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cli_command;
int cli_gen_man(FILE *f, const cli_command *cmds, size_t n);
int cli_gen_completion(FILE *f, const cli_command *cmds, size_t n);

#endif

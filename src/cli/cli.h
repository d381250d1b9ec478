#ifndef ND_CLI_H
#define ND_CLI_H

#include <stddef.h>
#include <stdio.h>

#define NEEDLE_VERSION_STRING "0.1.0"

int cli_init(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_bench_decode(int argc, char **argv);
int cli_bench_finetune(int argc, char **argv);
int cli_finetune(int argc, char **argv);
int cli_plot_loss(int argc, char **argv);
int cli_convert(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_render(int argc, char **argv);
int cli_generate_data(int argc, char **argv);
/* finetune --generate: n more examples for the tools of `data` (upstream's
 * augment_jsonl), written with the old ones to DATA.augmented.jsonl, whose
 * name is left in out. Returns 0, or 1 after printing the error. */
int cli_generate_augment(const char *data, long n, const char *model, int workers, char *out,
                         size_t out_n);

/* Tokenizer path: the flag, else $NEEDLE_TOKENIZER, else tokenizer.model
 * beside `checkpoint` (may be NULL; buf holds that path). Prints where to
 * get one and returns NULL when none is found. */
const char *cli_tokenizer_path(const char *flag_value, const char *checkpoint, char *buf, size_t n);
/* A missing checkpoint PATH is fetched from upstream's Hugging Face repo
 * (checkpoints/PATH, then checkpoints/basename, into ./checkpoints/) as
 * upstream's load_checkpoint does; `resolved` gets the local path. Prints
 * the error and returns 1 when neither is there nor downloadable. */
int cli_fetch_checkpoint(const char *path, char *resolved, size_t n);
/* Upstream's tokenizer (tokenizer/tokenizer.model of the Needle 2 or
 * Needle 3 repository, by `generation`) to `dest`; 1 on error (printed). */
int cli_fetch_tokenizer(const char *dest, int generation);
/* Upstream's Hugging Face repository of a model generation (2 or 3). */
const char *cli_hf_repo(int generation);
/* The base checkpoint a command uses when given none (`flag` says how to
 * give one: "--checkpoint PATH"): CLI_NEEDLE2_CHECKPOINT when present, else
 * the nano base (the lines saying so printed to `say`), else
 * CLI_NEEDLE2_CHECKPOINT, to be fetched; buf holds the path. */
#define CLI_NEEDLE2_CHECKPOINT "checkpoints/needle2.pkl"
const char *cli_default_base(FILE *say, const char *flag, char *buf, size_t n);
/* After cli_default_base fell back to needle2 and its fetch failed: say
 * where the nano base was looked for (stderr; nothing otherwise). */
void cli_default_base_hint(void);
/* The base checkpoint an adapter records it was trained on (our adapters'
 * needle_c_state.base_checkpoint), "" when it records none; 1 after
 * printing the error when the adapter cannot be read. */
int cli_adapter_base(const char *adapter, char *buf, size_t n);
int cli_download(int argc, char **argv);
int cli_build(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_run(int argc, char **argv);
/* `run --checkpoint X.pkl --query TEXT`: upstream's plain continuation */
int cli_run_checkpoint(int argc, char **argv);
int cli_eval_calls(int argc, char **argv);
int cli_grammar(int argc, char **argv);
int cli_playground(int argc, char **argv);

/* Print "needle: <message>" for the library's last error and return 1. */
int cli_fail(const char *context);
/* Refuse an output path that names one of the command's inputs (same
 * device and inode, links followed) or anything but a regular file. The
 * variadic part is (const char *what, const char *path) pairs ending with a
 * NULL `what`; NULL paths are skipped. Prints the error and returns 1, else
 * returns 0. */
int cli_check_output(const char *out, ...);
/* Report a usage error for a subcommand and return 2. */
/* The backend for --device (and --precision fp32|tf32|bf16, CUDA GEMMs
 * only); NULL after printing why. */
const struct nd_backend *cli_backend(const char *cmd, const char *device, const char *precision,
                                     int threads);
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Strict number parsing for flags; print an error naming the flag. */
int cli_parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out);
int cli_parse_double(const char *flag, const char *s, double *out);
/* fp32 FMA peak of this machine right now, GFLOP/s on all OpenMP threads
 * (best of short bursts over `seconds`); 0 when it cannot be measured.
 * *isa names the vector width used. */
double bench_fma_peak(double seconds, const char **isa);
/* The same at one vector width (8 = AVX2+FMA, 16 = AVX-512, 4 = NEON on
 * aarch64); 0 if absent. */
double bench_fma_peak_width(double seconds, int width);

#endif

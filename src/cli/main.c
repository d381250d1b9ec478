/* needle: command-line entry point. Each subcommand lives in its own file
 * and only parses flags and calls the library. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "core/tuning.h"

static const cli_command commands[] = {
    {"init", cli_init, "write a fresh random base checkpoint (upstream pickle format)"},
    {"eval", cli_eval, "next-token loss (and logits) of a checkpoint on token sequences"},
    {"finetune", cli_finetune, "LoRA fine-tune a base checkpoint on JSONL examples"},
    {"plot-loss", cli_plot_loss, "draw a finetune --loss-log file as an SVG loss curve"},
    {"convert", cli_convert, "rewrite a checkpoint's params as float16 or float32"},
    {"generate-data", cli_generate_data,
     "synthesise tool-calling examples with a chat-completions service (OpenRouter)"},
    {"build", cli_build, "merge a LoRA adapter and export a .cact archive (CQ quantised)"},
    {"run", cli_run, "a schema-constrained tool call from a .cact (--checkpoint: plain text)"},
    {"grammar", cli_grammar,
     "compile tools' schemas as `run` does; what is not enforced; sample calls"},
    {"eval-calls", cli_eval_calls, "score a .cact's tool calls on held-out JSONL examples"},
    {"download", cli_download, "download a file of a Hugging Face model repository (resumable)"},
    {"inspect", cli_inspect, "validate a .cact archive; print header, codebooks, tensors"},
    {"bench", cli_bench, "benchmarks (forward pass timing, tokens/s, GFLOP/s, peak RSS)"},
    {"tokenize", cli_tokenize, "text lines -> token ids (or ids -> text with --decode)"},
    {"render", cli_render, "show a JSONL example's rendered prompt/target, ids and loss mask"},
    {"playground", cli_playground, "local web UI: tools, chat, envelopes, upload, fine-tune"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: needle <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`needle <command> --help` describes each command.\n");
}

int main(int argc, char **argv)
{
    /* as upstream: a bare `needle` is a request for help, not an error */
    if (argc < 2) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("needle %s\n", NEEDLE_VERSION_STRING);
        return 0;
    }
    /* hidden: the man page and the bash completion, from the option tables
     * (built and installed with the program) */
    if (!strcmp(argv[1], "--man") && argc == 2)
        return cli_gen_man(stdout, commands, sizeof commands / sizeof commands[0]);
    if (!strcmp(argv[1], "--completion") && argc == 3 && !strcmp(argv[2], "bash"))
        return cli_gen_completion(stdout, commands, sizeof commands / sizeof commands[0]);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            /* the library's tuning switches (NEEDLE_QKERNEL, NEEDLE_KV_WINDOW
             * ...) are read here, at the entry, and handed to the library
             * (core/tuning.h); nothing below reads them from the environment */
            nd_tuning t;
            if (nd_tuning_from_env(&t) || nd_tuning_use(&t)) {
                fprintf(stderr, "needle: %s\n", nd_last_error());
                return 2;
            }
            return commands[i].fn(argc - 1, argv + 1);
        }
    if (!strcmp(argv[1], "fetch")) {
        /* upstream's `fetch` downloads its prebuilt engine library */
        fprintf(stderr, "needle: fetch: this needle is the engine: no prebuilt library to fetch; "
                        "build it here (`make`, or `make install PREFIX=...` for bin/needle, "
                        "lib/libneedle.so and needle.pc) and point NEEDLE_LIB_PATH at "
                        "libneedle.so for upstream's Python client\n");
        return 2;
    }
    fprintf(stderr, "needle: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/* needle convert: a checkpoint's params to float16 or float32, its
 * recommended fine-tune settings (train/recommend.h), and pickle <->
 * safetensors (by the output's name). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "train/recommend.h"

static const char *convert_usage = "usage: needle convert IN OUT [--dtype float16|float32]\n"
                                   "                      [--recommend KEY=VALUE,...|none]\n";
static const char *convert_about =
    "Rewrite a checkpoint with every floating-point tensor under params in the\n"
    "given dtype (round to nearest even, as numpy's astype), keeping config, step,\n"
    "run and the tensors we do not use (mtp_*). float16 is the format of\n"
    "upstream's published checkpoints; upstream's Python and our tools load both.\n"
    "IN is a pickle or a safetensors file (told by its content); OUT is written\n"
    "as safetensors when its name ends in .safetensors, else as a pickle, so\n"
    "`needle convert needle2.pkl needle2.safetensors` changes the file format\n"
    "alone (safetensors input: BF16 tensors are read as float32).\n"
    "The optimiser state of a stopped --full run (needle_c_state) is dropped: the\n"
    "output is a plain checkpoint.\n";

int cli_convert(int argc, char **argv)
{
    const char *dtype = NULL, *recommend = NULL;
    cli_opt opts[] = {
        {"--dtype", CLI_ENUM, &dtype, 0, 0, "T", "float16|float32",
         "float16 or float32 (default: the params stay as they are)", 0, 0},
        {"--recommend", CLI_STR, &recommend, 0, 0, "SPEC", NULL,
         "the fine-tune settings this checkpoint recommends, which `needle finetune` uses when "
         "their flags are not given: comma-separated KEY=VALUE with keys lr (in (0, 1]), "
         "lora_rank, lora_alpha, epochs, batch_size, e.g. lr=1e-3,lora_rank=16,lora_alpha=32. "
         "Replaces the checkpoint's record; `none` removes it. Stored as the top-level key "
         "needle_c_recommended (upstream's loader reads only format_version, params and config)",
         0, 0},
    };
    cli_cmd cmd = {"convert",
                   convert_usage,
                   convert_about,
                   "At least one of --dtype and --recommend is needed unless IN and OUT differ\n"
                   "in file format.\n",
                   opts,
                   CLI_NOPTS(opts),
                   2,
                   {0},
                   0};
    CLI_PARSE(&cmd, argc, argv);
    if (cmd.n_pos < 2)
        return cli_usage_error("convert", "expected IN OUT");
    const char *in = cmd.pos[0], *out = cmd.pos[1];
    int same_format = ckpt_file_is_safetensors(in) == ckpt_path_is_safetensors(out);
    if (!dtype && !recommend && same_format)
        return cli_usage_error("convert",
                               "nothing to do: give --dtype and/or --recommend, or an OUT of the "
                               "other file format (.safetensors or not)");
    nd_recommend rec = {0};
    int drop_rec = recommend && !strcmp(recommend, "none");
    if (recommend && !drop_rec && nd_recommend_parse(recommend, &rec))
        return cli_usage_error("convert", "%s", nd_last_error());
    if (cli_check_output(out, "input checkpoint", in, (const char *)NULL))
        return 1;
    san_model m = {0};
    pv *tree = NULL;
    /* loading validates it as a checkpoint of a model we know */
    int rc = ckpt_load(in, &m, &tree);
    san_model_free(&m);
    if (rc)
        return cli_fail(NULL);
    pv *plain = pv_dict();
    for (size_t i = 0; plain && i < tree->u.dict.n; i++) {
        const pv *k = tree->u.dict.keys[i];
        if (k->kind == PV_STR && (!strcmp(k->u.str.s, "needle_c_state") ||
                                  (recommend && !strcmp(k->u.str.s, ND_RECOMMEND_KEY))))
            continue;
        if (pv_dict_set_key(plain, k, pv_incref(tree->u.dict.vals[i])))
            rc = nd_error(ND_ENOMEM, "out of memory");
    }
    pv_decref(tree);
    if (!plain)
        return cli_fail(NULL);
    if (!rc && dtype)
        rc = ckpt_tree_params_to_dtype(plain, strcmp(dtype, "float16") ? ND_F32 : ND_F16);
    if (!rc && recommend && !drop_rec) {
        pv *r = nd_recommend_to_pv(&rec);
        rc = r ? pv_dict_set(plain, ND_RECOMMEND_KEY, r) : nd_error(ND_ENOMEM, "out of memory");
    }
    if (!rc)
        rc = ckpt_file_save(plain, out);
    pv_decref(plain);
    if (rc)
        return cli_fail(NULL);
    if (!same_format)
        printf("%s: %s\n", out, ckpt_path_is_safetensors(out) ? "safetensors" : "pickle");
    if (dtype)
        printf("%s: %s params\n", out, dtype);
    if (drop_rec)
        printf("%s: no recommended fine-tune settings\n", out);
    else if (recommend)
        printf("%s: recommends %s\n", out, recommend);
    return 0;
}

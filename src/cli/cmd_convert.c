/* needle convert: a checkpoint's params to float16 or float32. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/status.h"
#include "io/checkpoint.h"

static const char *convert_help =
    "usage: needle convert IN.pkl OUT.pkl --dtype float16|float32\n"
    "\n"
    "Rewrite a checkpoint with every floating-point tensor under params in the\n"
    "given dtype (round to nearest even, as numpy's astype), keeping config, step,\n"
    "run and the tensors we do not use (mtp_*). float16 is the format of\n"
    "upstream's published checkpoints; upstream's Python and our tools load both.\n"
    "The optimiser state of a stopped --full run (needle_c_state) is dropped: the\n"
    "output is a plain checkpoint.\n"
    "\n"
    "  --dtype T    float16 or float32 (required)\n";

int cli_convert(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *dtype = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(convert_help, stdout);
            return 0;
        }
        if (a[0] != '-' || a[1] != '-') {
            if (!in)
                in = a;
            else if (!out)
                out = a;
            else
                return cli_usage_error("convert", "unexpected argument '%s'", a);
            continue;
        }
        if (i + 1 >= argc)
            return cli_usage_error("convert", "%s needs a value", a);
        if (!strcmp(a, "--dtype"))
            dtype = argv[++i];
        else
            return cli_usage_error("convert", "unknown option '%s'", a);
    }
    if (!in || !out)
        return cli_usage_error("convert", "expected IN.pkl OUT.pkl");
    if (!dtype || (strcmp(dtype, "float16") && strcmp(dtype, "float32")))
        return cli_usage_error("convert", "--dtype must be float16 or float32");
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
        if (k->kind == PV_STR && !strcmp(k->u.str.s, "needle_c_state"))
            continue;
        if (pv_dict_set_key(plain, k, pv_incref(tree->u.dict.vals[i])))
            rc = nd_error(ND_ENOMEM, "out of memory");
    }
    pv_decref(tree);
    if (!plain)
        return cli_fail(NULL);
    if (!rc)
        rc = ckpt_tree_params_to_dtype(plain, strcmp(dtype, "float16") ? ND_F32 : ND_F16);
    if (!rc)
        rc = pickle_dump_file(plain, out);
    pv_decref(plain);
    if (rc)
        return cli_fail(NULL);
    printf("%s: %s params\n", out, dtype);
    return 0;
}

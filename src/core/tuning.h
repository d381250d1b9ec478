/* The library's tuning switches: one struct, filled from the environment at
 * the entry points only, read everywhere else.
 *
 * The NEEDLE_* switches (kernels, windows, memory budgets, test overrides)
 * are read from the environment in one place, nd_tuning_from_env, called by
 * the entry points: the program's main() (src/cli/main.c), and for a program
 * using the C ABI (include/needle.h) each model load and session open
 * (needle_model_load*, needle_session_new*, hence needle_load/needle_init).
 * The entry point installs the result; the code below reads the installed
 * struct (nd_tuning_get) instead of the environment.
 *
 * A program that installs its own (nd_tuning_use, as main() does) keeps it:
 * the C ABI's entry points then no longer consult the environment.
 *
 * String fields hold the variable's text as given ("" when unset; every
 * site treats an empty value as unset) and are checked where they are used,
 * so the errors still name the variable and its value. Flags are decided
 * here, as the sites decided them before.
 *
 * Not switches of ours, so read where they are used (tests/test_getenv_sites.py
 * lists them): HF_ENDPOINT/HF_HUB_OFFLINE/HF_TOKEN, the MPI launchers' rank
 * variables, OMP_NUM_THREADS, the optional-library overrides of core/dlib
 * (NEEDLE_LIBBLAS ...), the Vulkan loader's driver filter, the built-in
 * and the base's location (read by the public needle_default_weights_path
 * itself). The GPU plugins' switches are here: they reach a plugin in its
 * open call's options (backend/plugin.h). */
#ifndef ND_TUNING_H
#define ND_TUNING_H

#define ND_TUNING_WORD 64
#define ND_TUNING_PATH 4096

typedef struct nd_tuning {
    /* engine */
    char qkernel[ND_TUNING_WORD];      /* NEEDLE_QKERNEL: a matmul kernel by name */
    char att[ND_TUNING_WORD];          /* NEEDLE_ATT: ref|avx512|avx2 attention kernel */
    int no_vbmi;                       /* NEEDLE_NO_VBMI set: scalar activation placement */
    int float_path;                    /* NEEDLE_FLOAT set and not "0": dequantise at load */
    int decode_one_thread;             /* NEEDLE_DECODE_THREADS=0: decode on the caller */
    char kv_window[ND_TUNING_WORD];    /* NEEDLE_KV_WINDOW: positions a session keeps */
    char prefix_cache[ND_TUNING_WORD]; /* NEEDLE_PREFIX_CACHE: prefix cache entries */
    char copy_prior[ND_TUNING_WORD]; /* NEEDLE_COPY_PRIOR: 0, or EDGE,INSIDE,START[,QUOTE[,NAME]] */
    char choice_prior[ND_TUNING_WORD]; /* NEEDLE_CHOICE_PRIOR: 0, or the bonus */
    /* CPU backend */
    int fwht_ref; /* NEEDLE_FWHT_REF set: plain Walsh-Hadamard, no AVX-512 */
    /* backends */
    char plugin_dir[ND_TUNING_PATH]; /* NEEDLE_PLUGIN_DIR: GPU plugins looked for first */
    char gpu_probe[ND_TUNING_WORD];  /* NEEDLE_GPU_PROBE: 0 never, else always */
    char backend_decline[1024];      /* NEEDLE_BACKEND_DECLINE: op,op,... on the CPU */
    int vulkan_software;             /* NEEDLE_VULKAN_SOFTWARE set and not "0" */
    /* GPU plugins (passed in nd_plugin_opts) */
    char cuda_precision[ND_TUNING_WORD]; /* NEEDLE_CUDA_PRECISION: fp32|tf32|bf16 (--precision) */
    int cuda_tf32;                       /* NEEDLE_CUDA_TF32 set and not "0": as tf32 */
    int vulkan_validate;                 /* NEEDLE_VULKAN_VALIDATE set and not "0" */
    /* training */
    char act_budget_mb[ND_TUNING_WORD]; /* NEEDLE_ACT_BUDGET_MB: kept-activation memory */
    char lane_every[ND_TUNING_WORD];    /* NEEDLE_LANE_EVERY (tests): lanes every k layers */
    char logit_rows[ND_TUNING_WORD];    /* NEEDLE_LOGIT_ROWS (tests): logit slice rows */
    /* downloads, multi-GPU */
    char hf_stall_s[ND_TUNING_WORD]; /* NEEDLE_HF_STALL_S: a download's stall limit */
    char nccl[ND_TUNING_PATH];       /* NEEDLE_NCCL: libnccl to load, "0": none */
} nd_tuning;

/* The switches from the environment into *t (every field; unset ones
 * empty/0). ND_OK, or ND_EARG naming a variable whose value does not fit
 * its field. The only reader of these variables. */
int nd_tuning_from_env(nd_tuning *t);

/* The installed switches: what the last entry point installed (all unset
 * before any did). Never NULL; the struct stays valid and unchanged for the
 * life of the process, so threads may read it while another installs. */
const nd_tuning *nd_tuning_get(void);

/* Install *t (copied) for the process, and keep it: nd_tuning_refresh no
 * longer replaces it. The program's main() calls this. ND_OK or ND_ENOMEM. */
int nd_tuning_use(const nd_tuning *t);

/* The C ABI's entry points: read the environment and install it, unless the
 * program installed its own with nd_tuning_use. ND_OK, or the error of
 * nd_tuning_from_env. */
int nd_tuning_refresh(void);

#endif

/* What a GPU backend plugin (a shared library loaded with dlopen) exports.
 *
 * The plugin is self-contained: it sees backend.h and layout.h (inline
 * helpers only) and links its own runtime (CUDA, the Vulkan loader), so a
 * machine without that runtime still runs the CPU path of the same
 * program. */
#ifndef ND_PLUGIN_H
#define ND_PLUGIN_H

#include <stddef.h>

#include "backend/backend.h"

#define ND_PLUGIN_ABI                                                                              \
    7 /* 4: the Hadamard MLP ops; 5: attention_ext, qkv_taps, ...; 6: host_mem,                    \
        upload, download, zero; 7: nd_plugin_opts */
#define ND_PLUGIN_SYMBOL "nd_plugin_open"

/* The program's settings for a plugin, decided by the program (the CLI's
 * flags, the tuning switches of core/tuning.h): a plugin reads no
 * environment switches of its own. Fields are added at the end, with an
 * ABI bump. */
typedef struct nd_plugin_opts {
    int precision; /* CUDA GEMMs: 0 float32, 1 TF32 inputs, 2 bfloat16 inputs */
    int validate;  /* Vulkan: load the Khronos validation layer, abort on an error */
} nd_plugin_opts;

/* index >= 0: that device (software devices allowed); index < 0: the best
 * hardware device, software ones only when allow_software. On failure NULL
 * and a message in err (e.g. "no CUDA device"). *no_device is set to 1 when
 * the failure is only that no suitable device exists (auto then falls back
 * quietly). Repeated calls with the same arguments return the same table;
 * opts are read when the device is first opened. opts comes last, so a
 * plugin of an older ABI, called with it, still reads abi first and
 * refuses with its "plugin ABI N, program ABI M" message. */
typedef const nd_backend *(*nd_plugin_open_fn)(int abi, int index, int allow_software, int threads,
                                               int *no_device, char *err, size_t errlen,
                                               const nd_plugin_opts *opts);

#endif

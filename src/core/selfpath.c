#define _GNU_SOURCE
#include "core/selfpath.h"

#include <dlfcn.h>
#include <string.h>

void nd_image_dir(char *dir, size_t n)
{
    Dl_info info;
    dir[0] = 0;
    if (dladdr((void *)nd_image_dir, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash && (size_t)(slash - info.dli_fname) < n) {
            memcpy(dir, info.dli_fname, (size_t)(slash - info.dli_fname));
            dir[slash - info.dli_fname] = 0;
        }
    }
}

/* Where this code lives on disk, for files installed beside it (GPU
 * plugins, the built-in base model). */
#ifndef ND_SELFPATH_H
#define ND_SELFPATH_H

#include <stddef.h>

/* Absolute directory of the image holding this code: the program when
 * libneedle is linked statically (found from the system, not argv[0]), else
 * libneedle.so. "" when unknown. */
void nd_image_dir(char *dir, size_t n);

/* The running program's absolute path (symlinks resolved on Linux and
 * macOS), whatever argv[0] was; 0, or -1 and "" when unknown. */
int nd_exe_path(char *buf, size_t n);

#endif

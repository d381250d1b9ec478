/* Files installed with the library (the built-in base model and its
 * checkpoint): where they are looked up. */
#ifndef ND_ENGINE_BASE_H
#define ND_ENGINE_BASE_H

#include <stddef.h>

/* Path of `file` in $env_name when set (never second-guessed: an unreadable
 * one is an error), else the first readable of: beside the program or
 * libneedle.so, its ../share/needle, the installed data directory. ND_EIO
 * with every place tried in the error when none is there. */
int nd_base_file_path(const char *file, const char *env_name, char *buf, size_t n);

#endif

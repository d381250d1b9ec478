/* Where this code lives on disk, for files installed beside it (GPU
 * plugins, the built-in base model). */
#ifndef ND_SELFPATH_H
#define ND_SELFPATH_H

#include <stddef.h>

/* Directory of the image holding this code: the program when libneedle is
 * linked statically, else libneedle.so. "" when unknown. */
void nd_image_dir(char *dir, size_t n);

#endif

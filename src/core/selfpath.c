/* Where this code lives on disk. dladdr names the image that holds a
 * symbol, but for code linked into the program glibc gives argv[0] (the
 * bare "needle" when the program was found through PATH, or a path
 * relative to a folder left since): the program's own path comes from the
 * system instead (/proc/self/exe on Linux, _NSGetExecutablePath on macOS).
 * A shared library's name is made absolute with realpath. */
#define _GNU_SOURCE
#include "core/selfpath.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__APPLE__)
#include <mach-o/dyld.h>
#elif defined(__linux__)
#include <link.h>
#endif

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* the directory part of path into dir ("" when it has none or is too long) */
static void dir_of(const char *path, char *dir, size_t n)
{
    const char *slash = strrchr(path, '/');
    dir[0] = 0;
    if (slash && (size_t)(slash - path) < n) {
        size_t k = slash == path ? 1 : (size_t)(slash - path); /* "/x" -> "/" */
        memcpy(dir, path, k);
        dir[k] = 0;
    }
}

int nd_exe_path(char *buf, size_t n)
{
    if (!n)
        return -1;
    buf[0] = 0;
#if defined(__APPLE__)
    char raw[PATH_MAX], real[PATH_MAX];
    uint32_t size = sizeof raw;
    if (_NSGetExecutablePath(raw, &size) != 0)
        return -1;
    const char *p = realpath(raw, real) ? real : raw;
    if (strlen(p) >= n)
        return -1;
    strcpy(buf, p);
    return 0;
#elif defined(__linux__)
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    if (k <= 0 || (size_t)k >= n - 1)
        return buf[0] = 0, -1;
    buf[k] = 0;
    return buf[0] == '/' ? 0 : (buf[0] = 0, -1);
#else
    return -1;
#endif
}

#if defined(__linux__) && !defined(__APPLE__)
/* dl_iterate_phdr lists the program first: does its mapping hold addr? */
static int first_holds(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t a = *(uintptr_t *)data;
    *(uintptr_t *)data = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && a >= lo && a - lo < ph->p_memsz)
            *(uintptr_t *)data = 1;
    }
    return 1; /* only the first object */
}
#endif

/* is this code linked into the program (not a shared library)? */
static int in_program(const Dl_info *info)
{
#if defined(__APPLE__)
    return info->dli_fbase == (const void *)_dyld_get_image_header(0);
#elif defined(__linux__)
    (void)info;
    uintptr_t a = (uintptr_t)(void *)nd_image_dir;
    dl_iterate_phdr(first_holds, &a);
    return a == 1;
#else
    (void)info;
    return 0;
#endif
}

void nd_image_dir(char *dir, size_t n)
{
    Dl_info info;
    char path[PATH_MAX];
    dir[0] = 0;
    if (!n)
        return;
    int have = dladdr((void *)nd_image_dir, &info) && info.dli_fname && info.dli_fname[0];
    if (!have || in_program(&info) || !strchr(info.dli_fname, '/')) {
        if (nd_exe_path(path, sizeof path) == 0) {
            dir_of(path, dir, n);
            return;
        }
    }
    if (have && strchr(info.dli_fname, '/')) {
        const char *p = realpath(info.dli_fname, path) ? path : info.dli_fname;
        dir_of(p, dir, n);
    }
}

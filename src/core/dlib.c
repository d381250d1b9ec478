/* Optional libraries through dlopen (see dlib.h). */
#define _POSIX_C_SOURCE 200809L
#include "core/dlib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nd_dlib_load(const nd_dlib_spec *spec, const nd_dlib_sym *syms, size_t n_syms, char *why,
                 size_t why_len)
{
    void *h = NULL;
    const char *want = spec->env ? getenv(spec->env) : NULL;
    int forced = want && want[0];
    if (forced)
        h = dlopen(want, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; !h && !forced && i < spec->n_names; i++)
        h = dlopen(spec->names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_len, "cannot load %s (%s): install it (Debian: %s)", spec->what,
                 e ? e : (spec->n_names ? spec->names[0] : "?"), spec->install);
        return -1;
    }
    void *addr[64];
    if (n_syms > sizeof addr / sizeof *addr) {
        snprintf(why, why_len, "%s: too many symbols", spec->what);
        dlclose(h);
        return -1;
    }
    for (size_t i = 0; i < n_syms; i++) {
        addr[i] = dlsym(h, syms[i].name);
        if (!addr[i]) {
            snprintf(why, why_len, "the %s library %s lacks %s%s%s", spec->what,
                     forced ? want : "found", syms[i].name, spec->symbol_note ? " " : "",
                     spec->symbol_note ? spec->symbol_note : "");
            dlclose(h);
            return -1;
        }
    }
    /* function pointers travel through void * (POSIX dlsym) */
    for (size_t i = 0; i < n_syms; i++)
        memcpy(syms[i].slot, &addr[i], sizeof addr[i]);
    return 0;
}

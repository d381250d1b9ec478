/* Optional libraries loaded on first use (dlopen) instead of linked, so a
 * process maps only what its command calls: OpenBLAS (backend/cpu/blas_dl.c),
 * libcurl (net/curl_dl.c), libmicrohttpd (cli/playground/mhd_dl.c). */
#ifndef ND_CORE_DLIB_H
#define ND_CORE_DLIB_H

#include <stddef.h>

typedef struct {
    const char *name; /* the symbol */
    void *slot;       /* where its address goes: a function pointer's address */
} nd_dlib_sym;

typedef struct {
    const char *what;         /* "OpenBLAS": for messages */
    const char *env;          /* a variable naming the one library to try (path or soname) */
    const char *const *names; /* else these, in order */
    size_t n_names;
    const char *install;     /* "apt-get install libopenblas0-openmp" */
    const char *symbol_note; /* appended when a symbol is missing; may be NULL */
} nd_dlib_spec;

/* Open the library and fill every slot. 0, or -1 with the reason in why
 * (the slots are then left untouched; nothing stays loaded). */
int nd_dlib_load(const nd_dlib_spec *spec, const nd_dlib_sym *syms, size_t n_syms, char *why,
                 size_t why_len);

#endif

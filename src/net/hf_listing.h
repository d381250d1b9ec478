/* What a Hugging Face server says, made safe to use: the repository
 * listing's file names (they become paths under --dir) and any text of the
 * server's that reaches the terminal. No network here, so the fuzz target
 * (tests/fuzz/fuzz_hf_listing.c) runs it on its own. */
#ifndef ND_HF_LISTING_H
#define ND_HF_LISTING_H

#include <stddef.h>

/* NULL when name[0..n) is a safe relative path for a file the server
 * names, else why not ("a control byte", "a '..' path segment", ...):
 * 1..1024 bytes of valid UTF-8, no NUL, no control byte (C0, DEL, C1), no
 * bidirectional override, no backslash, not absolute, no empty, '.' or
 * '..' segment, segments of at most 255 bytes. */
const char *nd_hf_name_check(const char *name, size_t n);

/* s[0..n) for a terminal: printable ASCII and valid UTF-8 kept, a
 * backslash doubled, any other byte (controls, ESC, DEL, C1, invalid
 * UTF-8, bidirectional overrides) as \xNN. Always NUL-terminated; "..."
 * ends it when out (cap bytes, cap >= 4) is too small. Returns out. */
char *nd_hf_escape(const char *s, size_t n, char *out, size_t cap);

/* A repository listing ({"siblings": [{"rfilename": NAME}, ...]}) into its
 * names: a NULL-terminated malloc'd array (free each and the array) and its
 * count. ND_EFORMAT naming `what` (the URL) when it is not a listing or
 * holds an entry without a name or with an unsafe one (the name escaped,
 * and why); nothing is returned then. */
int nd_hf_parse_listing(const char *data, size_t len, const char *what, char ***files, int *count);

#endif

/* SHA-256 (FIPS 180-4): fingerprints that must not collide by accident
 * (the tool index is keyed by the model's and the tools' digests). */
#ifndef ND_SHA256_H
#define ND_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t bytes;
    unsigned char buf[64];
    size_t fill;
} nd_sha256_ctx;

void nd_sha256_init(nd_sha256_ctx *s);
void nd_sha256_update(nd_sha256_ctx *s, const void *data, size_t len);
void nd_sha256_final(nd_sha256_ctx *s, unsigned char out[32]);
/* One-shot digest of a buffer. */
void nd_sha256(const void *data, size_t len, unsigned char out[32]);

#endif

/* Constants of the model's definition, not of any backend: the CPU, CUDA
 * and Vulkan backends and the engine compute the same SAN with them. Plain
 * macros, so a plugin (C or CUDA C++) includes this without linking
 * anything. The Vulkan shaders cannot include C: engram_hash.comp repeats
 * the hash constants and gets the Sinkhorn rounds as an argument. */
#ifndef ND_MODEL_CONSTANTS_H
#define ND_MODEL_CONSTANTS_H

/* Sinkhorn-Knopp rounds that make the hyper-connection mixing matrix M
 * doubly stochastic (hyper_coeffs in backend/ops.def) */
#define SAN_SINKHORN_ROUNDS 20

/* The engram n-gram hash of table k over the tokens t, t-1, ..., t-order+1
 * (0 before the sequence start): acc = SEED * (k + 1); per token
 * acc = (acc ^ tok) * PRIME; then acc ^= acc >> 15; index acc % slots. */
#define SAN_ENGRAM_SEED 0x9E3779B9u
#define SAN_ENGRAM_PRIME 0x01000193u

#endif

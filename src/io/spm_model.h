/* SentencePiece .model reader: the ModelProto protobuf decoded by hand
 * (only the fields a BPE encoder needs; everything else is skipped).
 *
 * The parser never trusts a length: truncated or hostile input fails with
 * ND_EFORMAT and a message giving the byte offset of the problem. */
#ifndef ND_SPM_MODEL_H
#define ND_SPM_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* ModelProto.SentencePiece.Type values, as in sentencepiece_model.proto. */
enum {
    ND_SPM_NORMAL = 1,
    ND_SPM_UNKNOWN = 2,
    ND_SPM_CONTROL = 3,
    ND_SPM_USER_DEFINED = 4,
    ND_SPM_UNUSED = 5,
    ND_SPM_BYTE = 6,
};

/* TrainerSpec.ModelType values. */
enum { ND_SPM_UNIGRAM = 1, ND_SPM_BPE = 2, ND_SPM_WORD = 3, ND_SPM_CHAR = 4 };

typedef struct {
    const char *piece; /* NUL-terminated copy (may contain NULs; use len) */
    uint32_t len;
    float score;
    int type; /* ND_SPM_* */
} nd_spm_piece;

typedef struct {
    int present; /* the message appeared in the file */
    const char *name;
    const unsigned char *charsmap; /* precompiled_charsmap bytes (NULL if empty) */
    size_t charsmap_len;
    int add_dummy_prefix;         /* default 1 */
    int remove_extra_whitespaces; /* default 1 */
    int escape_whitespaces;       /* default 1 */
} nd_spm_normalizer;

typedef struct {
    nd_spm_piece *pieces;
    size_t n_pieces;
    /* TrainerSpec (proto2 defaults applied when absent) */
    int model_type;                     /* default ND_SPM_UNIGRAM */
    int vocab_size;                     /* default 8000 */
    int unk_id, bos_id, eos_id, pad_id; /* defaults 0, 1, 2, -1 */
    int byte_fallback;                  /* default 0 */
    int treat_whitespace_as_suffix;     /* default 0 */
    const char *unk_surface;            /* default " \u2047 " */
    nd_spm_normalizer normalizer;
    nd_spm_normalizer denormalizer;
    char *arena; /* owns every string above */
} nd_spm_model;

/* Parse a serialised ModelProto. On success *out owns its memory (free it
 * with nd_spm_model_free); on failure *out is left empty. */
int nd_spm_model_parse(const unsigned char *data, size_t len, nd_spm_model *out);

/* Read and parse a .model file (errors are prefixed with the path). */
int nd_spm_model_load(const char *path, nd_spm_model *out);

void nd_spm_model_free(nd_spm_model *m);

#endif

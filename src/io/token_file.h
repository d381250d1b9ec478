/* Text files of token ids: one sequence per line, ids separated by
 * whitespace, blank lines ignored. */
#ifndef ND_TOKEN_FILE_H
#define ND_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t *ids;   /* all sequences back to back */
    size_t *start;  /* start[i] .. start[i+1] */
    int *line;      /* source line of each sequence */
    int count;
} token_seqs;

/* Errors name "path:line". Ids must lie in [0, vocab). */
int token_file_read(const char *path, int vocab, token_seqs *out);
void token_seqs_free(token_seqs *s);

#endif

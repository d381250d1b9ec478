/* The network-free half of talking to a chat-completions service: reading
 * a reply body (choices[0].message.content, or why not) and keeping the API
 * key out of every text that is printed or logged. net/chat_client.c does
 * the requests; this is here so it can be tested and fuzzed without them. */
#ifndef ND_GEN_CHAT_REPLY_H
#define ND_GEN_CHAT_REPLY_H

#include <stddef.h>

/* Largest reply body accepted (bytes); a longer one is abandoned. */
#define ND_CHAT_MAX_REPLY ((size_t)64 << 20)

/* Copy src[0..n) into dst (dst_n bytes, always NUL-terminated) as one
 * printable line, keeping at most `max` bytes of it. Redaction comes before
 * the cut, so no cut can leave part of a secret behind:
 *   - every run that starts like `key` for at least min(4, strlen(key))
 *     bytes (the key itself, or a piece of it cut short elsewhere) becomes
 *     "***";
 *   - the token after "Bearer " (any case) becomes "***";
 *   - control bytes (newlines, NULs ...) become spaces.
 * A cut never splits a UTF-8 sequence. key may be NULL or "". Redaction
 * never lengthens the text, so dst may equal src (in place). Returns the
 * bytes written (without the NUL). */
size_t nd_redact_into(char *dst, size_t dst_n, const char *src, size_t n, const char *key,
                      size_t max);

/* nd_redact_into in place over the whole NUL-terminated string s. */
void nd_redact(char *s, const char *key);

/* Read a chat-completions reply body. 1: *content (malloc'd, NUL-terminated,
 * *content_len bytes) is choices[0].message.content. 0: err (err_n bytes)
 * says why -- not JSON, the service's own error message, no content -- with
 * `key` redacted and server text cut short. Negative: out of memory. */
int nd_chat_parse_reply(const char *body, size_t len, const char *key, char **content,
                        size_t *content_len, char *err, size_t err_n);

#endif

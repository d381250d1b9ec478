# cmake -DIN=file -DOUT=file.c -DSYMBOL=name -P embed_file.cmake
# Writes `const unsigned char SYMBOL[]` (NUL-terminated) and
# `const size_t SYMBOL_len` (without the NUL) holding IN's bytes.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" nhex)
math(EXPR nbytes "${nhex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT}.tmp "/* generated from ${IN} by cmake/embed_file.cmake */\n#include <stddef.h>\nconst unsigned char ${SYMBOL}[] = {\n${bytes}0x00};\nconst size_t ${SYMBOL}_len = ${nbytes};\n")
file(RENAME ${OUT}.tmp ${OUT})

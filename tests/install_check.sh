#!/bin/bash
# `cmake --install` into a DESTDIR under the build tree, then build a small C
# program against the installed library with pkg-config only and run it:
# needle_load of a tiny .cact, needle_init, needle_complete (registered as
# test_install; not under sanitizers or cross builds).
set -euo pipefail
BUILD=${NEEDLE_BUILD:?}
SRC=${NEEDLE_SRC:?}
DEST=$BUILD/install-test
rm -rf "$DEST"
DESTDIR=$DEST cmake --install "$BUILD" >"$BUILD/install-test.log"
PREFIX=$(sed -n 's/^prefix=//p' "$BUILD/needle.pc")
ROOT=$DEST$PREFIX
LIBDIR=$(sed -n 's/^libdir=\${prefix}\///p' "$BUILD/needle.pc")
fail() { echo "FAIL: $*"; exit 1; }
for f in bin/needle "$LIBDIR/libneedle.so" "$LIBDIR/libneedle.a" include/needle.h \
         "$LIBDIR/pkgconfig/needle.pc"; do
    [ -f "$ROOT/$f" ] || fail "not installed: $PREFIX/$f"
    echo "ok   installed $PREFIX/$f"
done
# the man page and the bash completion, made from the option tables
for f in share/man/man1/needle.1 share/bash-completion/completions/needle; do
    [ -s "$ROOT/$f" ] || fail "not installed: $PREFIX/$f"
    echo "ok   installed $PREFIX/$f"
done
# upstream 3.x's names for the per-generation engines: links to ours
for g in 2 3; do
    [ "$(readlink "$ROOT/$LIBDIR/libneedle$g.so")" = libneedle.so ] ||
        fail "$LIBDIR/libneedle$g.so is not a link to libneedle.so"
    echo "ok   $LIBDIR/libneedle$g.so -> libneedle.so"
done
for p in "$BUILD"/libneedle_*.so; do
    [ -e "$p" ] || continue
    [ -f "$ROOT/$LIBDIR/needle/$(basename "$p")" ] || fail "plugin $(basename "$p") not installed"
    echo "ok   plugin $LIBDIR/needle/$(basename "$p")"
done

# pkg-config sees the DESTDIR tree through its sysroot prefix
export PKG_CONFIG_PATH=$ROOT/$LIBDIR/pkgconfig PKG_CONFIG_SYSROOT_DIR=$DEST
FLAGS=$(pkg-config --cflags --libs needle) || fail "pkg-config needle"
echo "ok   pkg-config: $FLAGS"
[[ $FLAGS == *"-I$ROOT/include"* ]] || fail "cflags do not point into the install: $FLAGS"

W=$BUILD/install-test/work
mkdir -p "$W"
cat >"$W/use_needle.c" <<'C'
#include <needle.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    if (argv[1][0] == 0) /* "": no needle_load, the built-in base */
        goto init;
    FILE *f = fopen(argv[1], "rb");
    if (!f)
        return 3;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char *cact = malloc((size_t)n);
    if (!cact || fread(cact, 1, (size_t)n, f) != (size_t)n)
        return 4;
    fclose(f);
    if (needle_load(cact, (unsigned long long)n) != 0) {
        fprintf(stderr, "needle_load: %s\n", needle_last_error());
        return 1;
    }
    free(cact);
init:
    if (needle_init("", argv[2], NULL) < 0) {
        fprintf(stderr, "needle_init: %s\n", needle_last_error());
        return 1;
    }
    static char buf[65536];
    if (needle_complete("what is the weather in Paris", 32, buf, sizeof buf) < 0) {
        fprintf(stderr, "needle_complete: %s\n", needle_last_error());
        return 1;
    }
    printf("%s\n", buf);
    return 0;
}
C
# shellcheck disable=SC2086
${CC:-cc} -std=c11 -Wall -Wextra -Werror -o "$W/use_needle" "$W/use_needle.c" $FLAGS \
    -Wl,-rpath,"$ROOT/$LIBDIR" || fail "compile against the installed library"
echo "ok   compiled with pkg-config flags"
# the installed program builds the archive (tiny model, shipped tokenizer)
"$ROOT/bin/needle" init "$W/t.pkl" --preset tiny >/dev/null
"$ROOT/bin/needle" build "$W/t.pkl" --tokenizer "$SRC/models/tokenizer.model" \
    --out "$W/t.cact" >/dev/null
TOOLS='[{"name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]'
OUT=$("$W/use_needle" "$W/t.cact" "$TOOLS") || fail "program run"
echo "ok   program output: $OUT"
[[ $OUT == *'"function_calls"'* ]] || fail "no envelope from needle_complete"
LDD=$(ldd "$W/use_needle")
[[ $LDD == *"$ROOT/$LIBDIR/libneedle.so"* ]] || fail "not linked to the installed lib"
echo "ok   linked to $PREFIX/$LIBDIR/libneedle.so"

# the nano base in share/needle: the archive (when the build made it: not in
# a cross build), the checkpoint and tokenizer finetune/build fall back on
if [ -f "$SRC/models/needle-nano.pkl" ]; then
    for f in needle-nano.pkl tokenizer.model; do
        [ -f "$ROOT/share/needle/$f" ] || fail "not installed: $PREFIX/share/needle/$f"
        echo "ok   installed $PREFIX/share/needle/$f"
    done
    (cd "$W" && env -u NEEDLE_BASE_CHECKPOINT -u NEEDLE_TOKENIZER "$ROOT/bin/needle" build \
        --out nano.cact >nano-build.log) || fail "installed build without CKPT: $(cat "$W/nano-build.log")"
    grep -q "share/needle/needle-nano.pkl  the built-in nano base" "$W/nano-build.log" ||
        fail "installed build did not fall back on share/needle: $(cat "$W/nano-build.log")"
    echo "ok   installed build without CKPT: $(head -1 "$W/nano-build.log")"
fi
if [ -f "$BUILD/needle-nano.cact" ]; then
    [ -f "$ROOT/share/needle/needle-nano.cact" ] || fail "not installed: share/needle/needle-nano.cact"
    echo "ok   installed $PREFIX/share/needle/needle-nano.cact"
    OUT=$(env -u NEEDLE_BASE_WEIGHTS "$W/use_needle" "" "$TOOLS") ||
        fail "installed library without needle_load"
    [[ $OUT == *'"success": true'* ]] || fail "built-in base envelope: $OUT"
    echo "ok   installed library, no needle_load: $OUT"
    echo "$TOOLS" >"$W/tools.json"
    ERR=$(env -u NEEDLE_BASE_WEIGHTS "$ROOT/bin/needle" run --tools "$W/tools.json" \
          "what is the weather in Paris" 2>&1 >/dev/null) || fail "installed run without --weights: $ERR"
    [[ $ERR == *"share/needle/needle-nano.cact"* ]] || fail "run did not use share/needle: $ERR"
    echo "ok   installed run without --weights: $ERR"
fi

# the installed program looks for GPU plugins in PREFIX/LIBDIR/needle/: a
# junk plugin there must be the one it tried (and names)
if [ ! -e "$ROOT/$LIBDIR/needle/libneedle_cuda.so" ]; then
    mkdir -p "$ROOT/$LIBDIR/needle"
    echo junk >"$ROOT/$LIBDIR/needle/libneedle_cuda.so"
    ERR=$(NEEDLE_PLUGIN_DIR= "$ROOT/bin/needle" bench forward --preset tiny --iters 1 \
          --device cuda 2>&1 >/dev/null || true)
    [[ $ERR == *"$LIBDIR/needle/libneedle_cuda.so"* ]] || fail "plugin not looked up there: $ERR"
    echo "ok   plugin lookup in $LIBDIR/needle/: $ERR"
fi
echo "all ok"

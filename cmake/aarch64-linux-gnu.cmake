# Cross build for aarch64 Linux with Debian's cross gcc against Debian
# multiarch arm64 libraries (see docs/platforms.md, "aarch64 Linux"):
#   dpkg --add-architecture arm64 && apt-get update
#   apt-get install gcc-aarch64-linux-gnu qemu-user \
#     libopenblas-openmp-dev:arm64 libjansson-dev:arm64
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Tests run under qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR): ctest
# prefixes it to the C tests, and the Python/shell tests get $NEEDLE as a
# wrapper script that starts the aarch64 needle under it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Multiarch: arm64 libraries sit beside the build machine's under /usr, so
# there is no sysroot; search only the aarch64 directories for libraries.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu
                      /usr/include/x86_64-linux-gnu)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Baseline ARMv8-A: runs on every 64-bit ARM core (and on qemu's default).
set(NEEDLE_CPU "-mcpu=generic" CACHE STRING "CPU flag for cross builds")

# With libc6:arm64 installed (the multiarch libraries need it) the arm64
# loader is /lib/ld-linux-aarch64.so.1 and qemu needs no -L. Do not point
# -L at the cross toolchain's /usr/aarch64-linux-gnu then: its ld.so comes
# from another glibc build than the multiarch libc.so.6 it would load, and
# with that mix the first pthread_create spins for minutes.
find_program(QEMU_AARCH64 qemu-aarch64)
if(QEMU_AARCH64)
  if(EXISTS /lib/ld-linux-aarch64.so.1)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${QEMU_AARCH64})
  else()
    set(CMAKE_CROSSCOMPILING_EMULATOR ${QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
  endif()
endif()

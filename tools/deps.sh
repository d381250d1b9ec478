#!/usr/bin/env bash
# Ensure the Debian packages needle builds and tests with are present.
# As root: installs what is missing with apt-get. Otherwise: prints the
# exact apt line and fails.
set -euo pipefail
# libvulkan-dev + glslc build the Vulkan backend plugin; mesa-vulkan-drivers
# (lavapipe) and the validation layers let the suite run it on the CPU.
# libcurl4-openssl-dev: needle generate-data's HTTPS requests and Hugging Face
# downloads (needle download, automatic checkpoint/tokenizer fetches).
# libmicrohttpd-dev: the HTTP server of `needle playground`; chromium: its
# headless browser test (tests/test_playground_browser.py). openmpi-bin +
# libopenmpi-dev: `mpirun -np 2` data-parallel finetune (tests/test_mpi_finetune.py;
# needle loads libmpi at run time and links nothing of it).
BUILD_PKGS="build-essential cmake pkg-config libopenblas-openmp-dev libjansson-dev libcurl4-openssl-dev libvulkan-dev glslc libmicrohttpd-dev"
TEST_PKGS="python3 python3-jsonschema clang-format python3-numpy sentencepiece python3-sentencepiece clang libomp-dev mesa-vulkan-drivers vulkan-validationlayers chromium openmpi-bin libopenmpi-dev"
# --arm64: the aarch64 cross toolchain, qemu, and the arm64 multiarch
# libraries the cross build links (make arm64-build / arm64-check).
ARM64_PKGS="gcc-aarch64-linux-gnu qemu-user libc6:arm64 libopenblas-openmp-dev:arm64 libjansson-dev:arm64"
want="$BUILD_PKGS"
[ "${1:-}" = "--test" ] && want="$BUILD_PKGS $TEST_PKGS"
if [ "${1:-}" = "--arm64" ]; then
  want="cmake pkg-config $ARM64_PKGS"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    if [ "$(id -u)" = 0 ]; then
      dpkg --add-architecture arm64
    else
      echo "deps: run: sudo dpkg --add-architecture arm64 && sudo apt-get update" >&2
      exit 1
    fi
  fi
fi
missing=()
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "deps: missing Debian packages; run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

# Thin wrapper over CMake. `make` builds into build/; `make check` runs the
# whole suite; `make demo` runs the main job; `make asan-check` runs the
# suite under AddressSanitizer + UndefinedBehaviorSanitizer.
JOBS ?= $(shell nproc)
BUILD ?= build

.PHONY: install all build deps test-deps check demo asan-check tsan-check clang-build fuzz format clean \
	arm64-deps arm64-build arm64-check noomp-check vulkan-check cuda-build cuda-emu-check

all: build

deps:
	@bash tools/deps.sh

test-deps:
	@bash tools/deps.sh --test

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Installs like a C library: PREFIX/bin/needle, PREFIX/lib/libneedle.{so,a},
# PREFIX/include/needle.h, PREFIX/lib/pkgconfig/needle.pc and the GPU plugins
# (when built) in PREFIX/lib/needle/. DESTDIR stages it elsewhere.
PREFIX ?= /usr/local
install: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)
	DESTDIR=$(DESTDIR) cmake --install $(BUILD)

check: test-deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	bash examples/demo.sh $(BUILD)/needle

asan-check: test-deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DNEEDLE_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer over the engine and the C ABI (tests/test_threads.c: several
# sessions on several threads, reloads during completes). OpenMP runs one
# thread per region (libgomp is not instrumented: its own synchronisation
# would read as races); the races TSan looks for are between our threads.
# The same with OpenMP off (build-tsan-noomp): our own thread pool is
# instrumented, so there the kernels run multi-threaded under TSan, and
# test_threadpool checks the pool itself.
tsan-check: test-deps
	@cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DNEEDLE_TSAN=ON -DNEEDLE_NATIVE=OFF >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target test_threads
	cd build-tsan && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --output-on-failure -R '^test_threads$$'
	@cmake -S . -B build-tsan-noomp -DCMAKE_BUILD_TYPE=Debug -DNEEDLE_TSAN=ON -DNEEDLE_NATIVE=OFF \
	  -DNEEDLE_OPENMP=OFF >/dev/null
	@cmake --build build-tsan-noomp -j $(JOBS) --target test_threads test_threadpool
	cd build-tsan-noomp && OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=1 \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --output-on-failure -R '^test_thread(s|pool)$$'

# warnings-as-errors build with clang (compile only; the suite runs on gcc's)
clang-build: test-deps
	@CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build-clang -j $(JOBS)

fuzz: test-deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DNEEDLE_FUZZ=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS)

# aarch64 Linux: cross build with Debian's gcc-aarch64-linux-gnu against the
# arm64 multiarch libraries (tools/deps.sh --arm64 installs them as root),
# tests under qemu-aarch64. The C tests run whole under the emulator; the
# Python/shell tests run natively and start build-arm64/needle-emu (a
# wrapper that runs the aarch64 needle under qemu). ARM64_TESTS is the
# portable subset that fits the time CI can give emulation
# (docs/platforms.md says what is left out and why).
ARM64_TESTS ?= ^(test_grad_ops|test_engine|test_qkernels|test_qkernels_neon|test_qkernels_neondot|test_qkernels_neoni8mm|test_threads|test_fileio|test_grad_model|test_grad_model_remat|test_pack|test_san_parts|test_cq|test_tokenizer|test_pickle|test_pyjson|test_grammar_unit|test_callscore|test_gen_examples|fuzz_.*_replay|test_forward_ref|test_init|test_tokenizer_parity|test_render|test_checkpoint|test_pipeline_smoke)$$
arm64-deps:
	@bash tools/deps.sh --arm64

arm64-build: arm64-deps
	@cmake -S . -B build-arm64 -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/aarch64-linux-gnu.cmake >/dev/null
	@cmake --build build-arm64 -j $(JOBS)

arm64-check: test-deps arm64-build
	cd build-arm64 && OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive \
	  ctest --output-on-failure -j $(JOBS) -R '$(ARM64_TESTS)'

# OpenMP switched off (what a macOS build without libomp gets): the kernels'
# parallel loops run on our own thread pool (src/core/threadpool.c). Every
# test that runs the kernels runs here; NOOMP_SKIP leaves out what OpenMP
# cannot change: the Vulkan and CUDA tests (vulkan-check and cuda-emu-check
# run them), the parsers' fuzz replays, and tests of text, grammar, docs and
# files whose models are too small for a parallel region.
NOOMP_SKIP ?= (vulkan|cuda)$$|^fuzz_|^test_(grammar|grammar_large|grammar_cli|openapi_sample|docs|download|playground_browser|safetensors|tokenizer_parity|pyjson_dumps|render|render3|exports|install|corpus_gen|generate_data|vk_ops_.*)$$
noomp-check: test-deps
	@cmake -S . -B build-noomp -DCMAKE_BUILD_TYPE=Release -DNEEDLE_OPENMP=OFF >/dev/null
	@cmake --build build-noomp -j $(JOBS)
	cd build-noomp && ctest --output-on-failure -j $(JOBS) -E '$(NOOMP_SKIP)'

# The CUDA backend plugin (build-cuda/libneedle_cuda.so, fat binary for
# sm_80/86/89/90 + PTX). Compile only: it needs nvcc and cuBLAS, not a GPU;
# tests/device/cuda.sh runs it on one.
cuda-build: deps
	@cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DNEEDLE_CUDA=ON >/dev/null
	@cmake --build build-cuda -j $(JOBS) --target needle_cuda

# The plugin's kernels run on the CPU (tools/cuda_emu: a stand-in CUDA
# runtime, threads as coroutines) against the CPU backend: fine-tune losses
# and weights must agree. Checks index math without a GPU (minutes).
cuda-emu-check: build
	NEEDLE=$(BUILD)/needle bash tools/cuda_emu/check.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz build-arm64 build-noomp build-cuda build-cuda-emu

# The Vulkan backend on Mesa's lavapipe (software Vulkan on the CPU) under
# the Khronos validation layer: any validation error aborts the run. The
# plain suite runs the same tests without the layer; here a missing device
# is a failure, not a skip.
vulkan-check: test-deps build
	NEEDLE_PLUGIN_DIR=$(BUILD) $(BUILD)/needle bench forward --preset tiny --batch 2 --seq 16 \
	  --iters 1 --device vulkan:0
	cd $(BUILD) && NEEDLE_VULKAN_VALIDATE=1 ctest --output-on-failure -R 'vulkan'

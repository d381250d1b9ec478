# Thin wrapper over CMake. `make` builds into build/; `make check` runs the
# whole suite; `make demo` runs the main job; `make asan-check` runs the
# suite under AddressSanitizer + UndefinedBehaviorSanitizer.
JOBS ?= $(shell nproc)
BUILD ?= build

.PHONY: all build deps test-deps check demo asan-check tsan-check clang-build fuzz format clean

all: build

deps:
	@bash tools/deps.sh

test-deps:
	@bash tools/deps.sh --test

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

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
tsan-check: test-deps
	@cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DNEEDLE_TSAN=ON -DNEEDLE_NATIVE=OFF >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target test_threads
	cd build-tsan && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --output-on-failure -R '^test_threads$$'

# warnings-as-errors build with clang (compile only; the suite runs on gcc's)
clang-build: test-deps
	@CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build-clang -j $(JOBS)

fuzz: test-deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DNEEDLE_FUZZ=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz

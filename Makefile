# Thin wrapper over CMake. `make` builds into build/; `make check` runs the
# whole suite; `make demo` runs the main job; `make asan-check` runs the
# suite under AddressSanitizer + UndefinedBehaviorSanitizer.
JOBS ?= $(shell nproc)
BUILD ?= build

.PHONY: all build deps test-deps check demo asan-check clang-build fuzz format clean

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
	rm -rf $(BUILD) build-asan build-fuzz

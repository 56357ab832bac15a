# Tidepool: the two set-up commands are `make run` and `make test`.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
PY ?= /usr/bin/python3
LISTEN ?= 127.0.0.1:7070
DATA_DIR ?= /var/lib/tidepool

.PHONY: deps build run test unit integration bench clean asan-build test-asan tsan-build test-tsan fuzz-deps fuzz-build fuzz-smoke fuzz-long faults soak format format-check

deps:
	@sh scripts/install-deps.sh

# A unity build (batches of .cpp files per compile: the heavy Beast, Asio, JSON, CLI11
# and gtest headers parsed once per batch) takes about 2/3 of the CPU time of one
# compile per file. UNITY=OFF suits editing one file at a time.
UNITY ?= ON
# RelWithDebInfo with line tables only (-g1: file:line in backtraces and perf, no
# variables): full -g made each compile about 30% slower. BUILD_TYPE=Debug for gdb.
REL_FLAGS ?= -O2 -g1 -DNDEBUG
$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_UNITY_BUILD=$(UNITY) \
		-DCMAKE_C_FLAGS_RELWITHDEBINFO="$(REL_FLAGS)" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(REL_FLAGS)"

# The microvm tier's guest (kernel, initrd with tp-agent, host image) is made after the
# binaries: scripts/microvm-assets.sh (idempotent; apt for QEMU and the kernel package).
build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) --parallel
	sh scripts/microvm-assets.sh $(BUILD)

run: build
	$(BUILD)/bin/tidepoold --listen $(LISTEN) --data-dir $(DATA_DIR)

unit: build
	cd $(BUILD) && ctest --output-on-failure

integration: build
	TIDEPOOL_BUILD=$(abspath $(BUILD)) $(PY) -m pytest -q -p no:cacheprovider tests/integration

# Extra gtest flags for the unit test runs (e.g. UNIT_FILTER=--gtest_filter=Agent*).
UNIT_FILTER ?=
# The unit tests run as one process (ctest --output-on-failure in $(BUILD) runs one per
# test). The Python suites run on three workers, a file at a time each (pytest-xdist,
# --dist loadfile): most of their time is spent waiting on sandboxes, apt and sleeps,
# and each worker has its own daemons, so the files do not see each other. On 2 cores
# three workers took make test's suites from 582 s to 461 s. PYTEST_JOBS=0 runs them in
# this process.
PYTEST_JOBS ?= 3
PYTEST = $(PY) -m pytest -q -p no:cacheprovider $(if $(filter-out 0,$(PYTEST_JOBS)),-n $(PYTEST_JOBS) --dist loadfile)
test: build
	TP_BIN_DIR=$(abspath $(BUILD))/bin $(BUILD)/bin/unit_tests --gtest_brief=1 $(UNIT_FILTER)
	TIDEPOOL_BUILD=$(abspath $(BUILD)) $(PYTEST) --durations=15 sdk/python/tests tests/integration tests/hostile tests/faults tests/soak

bench: build
	cmake --build $(BUILD) --parallel --target benchmarks
	sh bench/run.sh

# -- formatting (.clang-format). CI runs format-check first. The version is pinned
# (Debian's clang-format-14, scripts/install-deps.sh): another version formats some
# constructs differently, and the check would then fail on untouched files.
CLANG_FORMAT ?= clang-format-14
# Every C and C++ file git tracks (not build trees or scratch files).
FORMAT_FILES = $(shell git ls-files '*.c' '*.h' '*.cc' '*.cpp' '*.hpp')

format: deps
	@$(CLANG_FORMAT) -i --style=file $(FORMAT_FILES)

# Lists every file clang-format would change and fails if there is one (make format
# rewrites them). One clang-format process for all files: one per file took 30 s of CI.
format-check: deps
	@out=$$($(CLANG_FORMAT) --style=file --dry-run --Werror $(FORMAT_FILES) 2>&1); rc=$$?; \
	if [ $$rc -ne 0 ]; then \
		bad=$$(echo "$$out" | sed -n 's/^\([^: ]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/  \1/p' | sort -u); \
		if [ -n "$$bad" ]; then \
			echo "format-check: $(CLANG_FORMAT) would change these files (run make format):"; \
			echo "$$bad"; \
		else \
			echo "format-check: $(CLANG_FORMAT) failed (exit $$rc):"; echo "$$out" | head -5; \
		fi; \
		exit 1; \
	fi; \
	echo "format-check: $(words $(FORMAT_FILES)) files formatted as .clang-format says"

clean:
	rm -rf $(BUILD)

# -- sanitizers, faults, soak, fuzzing (CI runs test, test-asan and fuzz-smoke: .ci/run) --
# One clang-19 build serves the sanitizer tests and the fuzzers (CMakeLists.txt, TP_FUZZ
# with TP_SANITIZE): libraries built once with ASan+UBSan and libFuzzer's coverage hooks;
# the daemon, CLI and unit tests link the sanitizer runtimes, the harnesses libFuzzer.
SAN_BUILD ?= build-san
FUZZ_SECONDS ?= 45
# What the ASan daemon runs through: the integration and fault suites minus the slow image build
# (mmdebstrap: minutes of apt work that exercise no more daemon code than the imports).
# The microvm tier's tests (marker vm) are left out: QEMU guests exercise no daemon code
# that the container tier does not, at many times the cost.
ASAN_PYTEST ?= tests/integration tests/faults -m "not slow and not vm"
LLVM_SYMBOLIZER = /usr/lib/llvm-19/bin/llvm-symbolizer
# Any report fails the run: ASan and UBSan halt (UBSan is also built -fno-sanitize-recover),
# LSan reports leaks at exit (exit code != 0). .ci/lsan.supp says why each suppression is there.
SAN_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=0 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/.ci/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	$(if $(wildcard $(LLVM_SYMBOLIZER)),ASAN_SYMBOLIZER_PATH=$(LLVM_SYMBOLIZER))

# -O0 with line tables only (SAN_OPT, read when $(SAN_BUILD) is configured): on 2 cores
# it builds in 220 s against 380 s at -O1, and the sanitizer tests run about 15% slower.
# The fuzzers execute 4-12x fewer inputs per second than at -O1: enough for CI's smoke
# run; a long fuzzing run wants its own -O1 build (fuzz/README.md). A unity build
# (CMAKE_UNITY_BUILD: batches of up to 8 .cpp files per compile, so Beast, Asio, JSON,
# CLI11 and gtest are parsed and instantiated once per batch) needs about 2/3 of the CPU
# time of one compile per file; CMakeLists.txt lists the files kept out of batches.
SAN_OPT ?= -O0 -g1
SAN_CMAKE = -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="$(SAN_OPT)" -DCMAKE_CXX_FLAGS_DEBUG="$(SAN_OPT)" \
	-DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DTP_SANITIZE=ON -DTP_FUZZ=ON \
	-DCMAKE_UNITY_BUILD=ON
# What the ASan tests need (not the benchmarks).
ASAN_TARGETS = tidepoold tp-agent tidepool unit_tests \
	$(patsubst tests/payloads/%.c,payload_%,$(wildcard tests/payloads/*.c))
FUZZ_TARGETS = wire_fuzz http_fuzz archive_fuzz

$(SAN_BUILD)/build.ninja:
	cmake -S . -B $(SAN_BUILD) -G Ninja $(SAN_CMAKE)

fuzz-deps:
	@sh scripts/install-fuzz-deps.sh

asan-build: deps fuzz-deps $(SAN_BUILD)/build.ninja
	cmake --build $(SAN_BUILD) --parallel --target $(ASAN_TARGETS)

# Unit tests and the integration suite against an ASan+UBSan daemon (tp-agent and the
# payloads stay static and unsanitized: they run inside sandboxes).
# The unit tests run as one process, as under TSan (ctest starts one per test: ~360
# starts of an ASan binary, about a second each); the manager's random interleavings
# run 300 seeds (the g++ run does all 2,000).
test-asan: asan-build
	$(SAN_ENV) TP_BIN_DIR=$(CURDIR)/$(SAN_BUILD)/bin TP_TEST_SEEDS=300 $(SAN_BUILD)/bin/unit_tests $(UNIT_FILTER)
	$(SAN_ENV) TIDEPOOL_BUILD=$(CURDIR)/$(SAN_BUILD) $(PYTEST) $(ASAN_PYTEST)

# -- ThreadSanitizer (CI runs test-tsan after test-asan) --
# Its own clang-19 build (TSan excludes ASan): a unity build as above, only what the
# tests need, at -O0 -g1 (TSAN_OPT): no fuzzer runs from it, and on 2 cores it builds in
# about a third of the time -O1 takes (110 s against 345 s), and its tests still take
# about a minute (unit tests 40 s, integration 25 s). tp-agent and the payloads stay
# static and unsanitized.
TSAN_BUILD ?= build-tsan
TSAN_OPT ?= -O0 -g1
TSAN_CMAKE = -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="$(TSAN_OPT)" -DCMAKE_CXX_FLAGS_DEBUG="$(TSAN_OPT)" \
	-DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DTP_TSAN=ON -DCMAKE_UNITY_BUILD=ON
# The integration tests whose daemon runs many requests, streams and sandboxes at once
# (test_race.py when present). The rest of the suite exercises no more of the daemon's
# threading and is left to make test and test-asan, to keep CI's time in check.
TSAN_PYTEST ?= $(wildcard tests/integration/test_race.py tests/integration/test_sdk_async.py \
	tests/integration/test_streaming.py tests/integration/test_lifecycle.py) -m "not slow and not vm"
# Any report fails the run: halt_on_error stops the process at the first report and
# exitcode makes that a failure even where the report comes from a destructor at exit.
# .ci/tsan.supp says why each suppression is there.
# atexit_sleep_ms=0: TSan otherwise sleeps 1 s in every process's exit (each daemon the
# tests start and stop).
TSAN_ENV = TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:atexit_sleep_ms=0:suppressions=$(CURDIR)/.ci/tsan.supp$(if $(wildcard $(LLVM_SYMBOLIZER)),:external_symbolizer_path=$(LLVM_SYMBOLIZER))"

$(TSAN_BUILD)/build.ninja:
	cmake -S . -B $(TSAN_BUILD) -G Ninja $(TSAN_CMAKE)

tsan-build: deps fuzz-deps $(TSAN_BUILD)/build.ninja
	cmake --build $(TSAN_BUILD) --parallel --target $(ASAN_TARGETS)

# The unit tests run as one process (ctest starts one per test: ~200 starts of a TSan
# binary, each mapping its shadow memory); the manager's random interleavings run 200
# seeds instead of 2,000 (each is many times slower under TSan).
test-tsan: tsan-build
	$(TSAN_ENV) TP_BIN_DIR=$(CURDIR)/$(TSAN_BUILD)/bin TP_TEST_SEEDS=200 $(TSAN_BUILD)/bin/unit_tests $(UNIT_FILTER)
	$(TSAN_ENV) TIDEPOOL_BUILD=$(CURDIR)/$(TSAN_BUILD) $(PYTEST) $(TSAN_PYTEST)

faults: build
	TIDEPOOL_BUILD=$(abspath $(BUILD)) $(PY) -m pytest -q -p no:cacheprovider tests/faults

# The documented soak run (tests/soak/soak.py --help); CI runs a short one in pytest.
soak: build
	$(PY) tests/soak/soak.py --sandboxes 500 --minutes 10

fuzz-build: deps fuzz-deps $(SAN_BUILD)/build.ninja
	cmake --build $(SAN_BUILD) --parallel --target $(FUZZ_TARGETS)

# Each harness for FUZZ_SECONDS on its seed corpus (new inputs go to a scratch corpus in
# the build dir, crashes to $(SAN_BUILD)/artifacts/). The three run side by side: on 2
# cores each gets about two thirds of one, and the step takes FUZZ_SECONDS instead of
# three times that. A harness that fails prints its log's tail and fails the target once
# all have ended. fuzz/README.md has the details.
FUZZ_HARNESSES = wire http archive
fuzz-smoke: fuzz-build
	@mkdir -p $(SAN_BUILD)/artifacts
	@for h in $(FUZZ_HARNESSES); do \
		mkdir -p $(SAN_BUILD)/corpus-$$h; rm -f $(SAN_BUILD)/fuzz-$$h.rc; \
		echo "fuzz: $${h}_fuzz for $(FUZZ_SECONDS)s"; \
		( $(if $(wildcard $(LLVM_SYMBOLIZER)),ASAN_SYMBOLIZER_PATH=$(LLVM_SYMBOLIZER)) \
		$(SAN_BUILD)/bin/$${h}_fuzz -max_total_time=$(FUZZ_SECONDS) -timeout=30 -rss_limit_mb=2048 \
			-print_final_stats=1 -artifact_prefix=$(CURDIR)/$(SAN_BUILD)/artifacts/ \
			$(SAN_BUILD)/corpus-$$h fuzz/corpus/$$h > $(SAN_BUILD)/fuzz-$$h.log 2>&1; \
		  echo $$? > $(SAN_BUILD)/fuzz-$$h.rc ) & \
	done; wait; \
	failed=""; for h in $(FUZZ_HARNESSES); do \
		if [ "$$(cat $(SAN_BUILD)/fuzz-$$h.rc 2>/dev/null)" = 0 ]; then \
			echo "fuzz: $${h}_fuzz:"; \
			grep -E "stat::number_of_executed_units|cov:" $(SAN_BUILD)/fuzz-$$h.log | tail -n 2; \
		else \
			echo "fuzz: $${h}_fuzz FAILED (exit $$(cat $(SAN_BUILD)/fuzz-$$h.rc 2>/dev/null)):"; \
			tail -n 60 $(SAN_BUILD)/fuzz-$$h.log; failed="$$failed $$h"; \
		fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: failed:$$failed"; exit 1; fi

fuzz-long: FUZZ_SECONDS = 3600
fuzz-long: fuzz-smoke

# Tidepool: the two set-up commands are `make run` and `make test`.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
PY ?= /usr/bin/python3
LISTEN ?= 127.0.0.1:7070
DATA_DIR ?= /var/lib/tidepool

.PHONY: deps build run test unit integration bench clean asan-build test-asan fuzz-deps fuzz-build fuzz-smoke fuzz-long faults soak

deps:
	@sh scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) --parallel

run: build
	$(BUILD)/bin/tidepoold --listen $(LISTEN) --data-dir $(DATA_DIR)

unit: build
	cd $(BUILD) && ctest --output-on-failure

integration: build
	$(PY) -m pytest -q -p no:cacheprovider tests/integration

test: build
	cd $(BUILD) && ctest --output-on-failure
	$(PY) -m pytest -q -p no:cacheprovider sdk/python/tests tests/integration tests/hostile tests/faults tests/soak

bench: build
	sh bench/run.sh

clean:
	rm -rf $(BUILD)

# -- sanitizers, faults, soak, fuzzing (CI runs test, test-asan and fuzz-smoke: .ci/run) --
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 45
# What the ASan daemon runs through: the integration and fault suites minus the slow image build
# (mmdebstrap: minutes of apt work that exercise no more daemon code than the imports).
ASAN_PYTEST ?= tests/integration tests/faults -m "not slow"
SAN_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=0 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/.ci/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# Sanitizer and fuzz builds use -O1 with line tables only: about half the compile time
# of RelWithDebInfo, still fast enough to test, and asserts stay on.
SAN_CMAKE = -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1"
# What the ASan tests need (not the benchmarks).
ASAN_TARGETS = tidepoold tp-agent tidepool unit_tests \
	$(patsubst tests/payloads/%.c,payload_%,$(wildcard tests/payloads/*.c))

$(ASAN_BUILD)/build.ninja:
	cmake -S . -B $(ASAN_BUILD) -G Ninja $(SAN_CMAKE) -DTP_SANITIZE=ON

asan-build: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) --parallel --target $(ASAN_TARGETS)

# Unit tests and the integration suite against an ASan+UBSan daemon (tp-agent and the
# payloads stay static and unsanitized: they run inside sandboxes).
test-asan: asan-build
	cd $(ASAN_BUILD) && $(SAN_ENV) ctest --output-on-failure
	$(SAN_ENV) TIDEPOOL_BUILD=$(CURDIR)/$(ASAN_BUILD) $(PY) -m pytest -q -p no:cacheprovider $(ASAN_PYTEST)

faults: build
	$(PY) -m pytest -q -p no:cacheprovider tests/faults

# The documented soak run (tests/soak/soak.py --help); CI runs a short one in pytest.
soak: build
	$(PY) tests/soak/soak.py --sandboxes 500 --minutes 10

fuzz-deps:
	@sh scripts/install-fuzz-deps.sh

$(FUZZ_BUILD)/build.ninja:
	cmake -S . -B $(FUZZ_BUILD) -G Ninja $(SAN_CMAKE) -DTP_FUZZ=ON \
		-DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19

fuzz-build: fuzz-deps $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) --parallel

# Each harness for FUZZ_SECONDS on its seed corpus (new inputs go to a scratch corpus in
# the build dir, crashes to $(FUZZ_BUILD)/artifacts/). fuzz/README.md has the details.
fuzz-smoke: fuzz-build
	@mkdir -p $(FUZZ_BUILD)/artifacts
	@for h in wire http archive; do \
		mkdir -p $(FUZZ_BUILD)/corpus-$$h; \
		echo "fuzz: $${h}_fuzz for $(FUZZ_SECONDS)s"; \
		$(FUZZ_BUILD)/bin/$${h}_fuzz -max_total_time=$(FUZZ_SECONDS) -timeout=30 -rss_limit_mb=2048 \
			-print_final_stats=1 -artifact_prefix=$(CURDIR)/$(FUZZ_BUILD)/artifacts/ \
			$(FUZZ_BUILD)/corpus-$$h fuzz/corpus/$$h > $(FUZZ_BUILD)/fuzz-$$h.log 2>&1 \
			|| { tail -n 60 $(FUZZ_BUILD)/fuzz-$$h.log; exit 1; }; \
		grep -E "stat::number_of_executed_units|cov:" $(FUZZ_BUILD)/fuzz-$$h.log | tail -n 2; \
	done

fuzz-long: FUZZ_SECONDS = 3600
fuzz-long: fuzz-smoke

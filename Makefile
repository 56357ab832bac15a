# Tidepool: the two set-up commands are `make run` and `make test`.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
PY ?= /usr/bin/python3
LISTEN ?= 127.0.0.1:7070
DATA_DIR ?= /var/lib/tidepool

.PHONY: deps build run test unit integration bench clean

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
	$(PY) -m pytest -q -p no:cacheprovider sdk/python/tests tests/integration tests/hostile

bench: build
	sh bench/run.sh

clean:
	rm -rf $(BUILD)

# tandem: the two entry points are `make demo` and `make test`; both install what is
# missing (Debian packages via apt-get), configure, build and run.

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
DEMO_CONFIG ?= configs/shakespeare-char.json
DEMO_DIR ?= runs/shakespeare-char

DEBIAN_PACKAGES := build-essential cmake pkg-config libopenblas-openmp-dev nlohmann-json3-dev \
	libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev openmpi-bin libopenmpi-dev \
	python3-matplotlib python3-pip

# As root, apt-get directly; as a user, through sudo, keeping DEBIAN_FRONTEND (sudo's
# env_reset would drop it, and a debconf question would then stop the install).
APT := $(shell [ "$$(id -u)" = 0 ] && echo "env DEBIAN_FRONTEND=noninteractive apt-get" || echo "sudo env DEBIAN_FRONTEND=noninteractive apt-get")

.PHONY: all deps pydeps build test test-long demo clean format

all: build

deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then \
	    echo "make deps: these Debian packages are missing:$$missing"; \
	    echo "installing them needs root, and this user has no sudo: as root, run"; \
	    echo "  apt-get install -y$$missing"; \
	    echo "(or install sudo and add this user to the sudo group), then run make again"; \
	    exit 1; \
	  fi; \
	  echo "installing:$$missing"; \
	  [ "$$(id -u)" = 0 ] || echo "(through sudo: it may ask for your password)"; \
	  $(APT) update -qq && $(APT) install -y -qq $$missing; \
	fi

# Python packages of the tokenizer tests (tools/tokenize_bpe.py, tests/runs/test_tokenize_bpe.cc),
# installed with pip where python3 cannot import them; --break-system-packages only where
# pip refuses without it (Debian's python3 is "externally managed"). A failed install is
# a warning: the tests that need the package then skip, saying why.
PY_PACKAGES := tokenizers tiktoken jinja2 pyarrow

# After deps (python3 and pip are among its packages), whatever -j.
pydeps: deps
	@for p in $(PY_PACKAGES); do \
	  python3 -c "import $$p" 2>/dev/null && continue; \
	  echo "installing python package $$p"; \
	  out=$$(python3 -m pip install -q $$p 2>&1) && continue; \
	  if echo "$$out" | grep -q externally-managed-environment; then \
	    python3 -m pip install -q --break-system-packages $$p && continue; \
	  else \
	    echo "$$out"; \
	  fi; \
	  echo "warning: could not install $$p for python3; the tests that need it skip, saying why"; \
	done

# The configure step. Its target is a stamp written only once CMake has configured and
# generated: a configure that failed (or was interrupted) leaves no stamp, so the next make
# configures again, instead of taking a half-written build/ for a configured one (whose
# missing Makefile then stops every `cmake --build`). A failed configure also deletes its
# CMakeCache.txt: what that run did not find (a package not yet installed, "no MPI") must
# not be cached for the next one. `| deps`: configure only after deps has installed the
# packages, whatever -j (order-only, as deps always runs and must not force a reconfigure).
CONFIGURED := $(BUILD_DIR)/.tandem-configured

$(CONFIGURED): | deps
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) || { rm -f $(BUILD_DIR)/CMakeCache.txt; exit 1; }
	touch $@

build: deps $(CONFIGURED)
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Tests labelled `long` (minutes each: the 200-kill crash test) run only with `make test-long`.
test: build pydeps
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) -LE long

test-long: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) -L long

# A fresh demo run each time: the previous demo output is replaced.
# The demo needs only the tandem binary, not the test suite (a third of the first build).
demo: deps $(CONFIGURED)
	cmake --build $(BUILD_DIR) -j $(JOBS) --target tandem
	rm -rf $(DEMO_DIR)
	$(BUILD_DIR)/tandem train --config $(DEMO_CONFIG) --metrics $(DEMO_DIR)/metrics.jsonl

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD_DIR)

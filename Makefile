# `make run` and `make test` work on a fresh Debian 12 machine: each installs what is
# missing (scripts/install-deps), configures, builds, then runs.
BUILD       ?= build
BUILD_TYPE  ?= RelWithDebInfo
JOBS        ?= $(shell nproc)
CMAKE_FLAGS ?=
NPROC       ?= 2
EPOCHS      ?= 2
DEVICE      ?= auto
RUN_DIR     ?= $(BUILD)/fashion_mnist_run
LM_TP       ?= 2
LM_STEPS    ?= 600
LM_DEVICE   ?= cpu
LM_ARGS     ?=
COHORT       = $(BUILD)/tools/cohort/cohort

export CCACHE_SLOPPINESS = pch_defines,time_macros,include_file_mtime,include_file_ctime

.PHONY: all deps configure build run run-lm test test-torch2 test-torch2-cuda test-pypi build-pypi build-asan test-asan fuzz bench install clean

all: build

deps:
	scripts/install-deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: the Fashion-MNIST trainer on 2 processes for 2 epochs, on the GPU when
# LibTorch has CUDA and one is visible (DEVICE=auto), else on the CPU. Interrupt it
# and `make run` again resumes from the last checkpoint; a finished run starts over.
# It builds only what it runs (the library, the launcher and the trainer: about half
# of the build's translation units), so a first `make run` on a fresh machine takes
# minutes, not the whole suite's build (issue 29).
run: configure
	cmake --build $(BUILD) -j $(JOBS) --target cohort_cli fashion_mnist
	@if [ -f $(RUN_DIR)/final.pt ]; then rm -rf $(RUN_DIR); fi
	$(COHORT) run --nproc-per-node $(NPROC) $(BUILD)/examples/fashion_mnist/fashion_mnist \
	  --epochs $(EPOCHS) --device $(DEVICE) --checkpoint-dir $(RUN_DIR)/checkpoints \
	  --checkpoint-every 200 --save-final $(RUN_DIR)/final.pt

# The second main job: a small GPT trained on the fortunes of Debian's `fortunes`
# package, tensor parallel over 2 processes (TP = LM_TP), a few minutes on two CPU
# cores (docs/gpt.md). It prints the validation loss, tokens/s, MFU, sampled text
# and a JSON line. The tokenizer is trained once and cached (~/.cache/cohort/gpt).
run-lm: configure
	cmake --build $(BUILD) -j $(JOBS) --target cohort_cli gpt gpt_tokenize
	$(COHORT) run --nproc-per-node $(NPROC) $(BUILD)/examples/gpt/gpt \
	  --tp $(LM_TP) --steps $(LM_STEPS) --device $(LM_DEVICE) $(LM_ARGS)

test: build
	scripts/run-tests $(BUILD)

# The same suite against LibTorch 2.6, in a Debian 13 chroot made by
# scripts/torch2-chroot (a few minutes the first time, reused after).
# TORCH2_FLAVOR=cuda builds against Debian's CUDA LibTorch with NCCL, warnings as
# errors, and runs the suite on this machine's CPU (docs/gpu_without_a_gpu.md).
TORCH2_FLAVOR ?= cpu
TORCH2_FLAGS  ?=
TORCH2_TEST_ENV ?=
TORCH2_BUILD   = $(if $(filter cuda,$(TORCH2_FLAVOR)),build-torch2-cuda,build-torch2)
test-torch2:
	COHORT_TORCH2_FLAVOR=$(TORCH2_FLAVOR) scripts/torch2-chroot 'cmake -S . -B $(TORCH2_BUILD) \
	  -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(TORCH2_FLAGS) && \
	  cmake --build $(TORCH2_BUILD) -j $(JOBS) && $(TORCH2_TEST_ENV) scripts/run-tests $(TORCH2_BUILD)'

test-torch2-cuda:
	$(MAKE) test-torch2 TORCH2_FLAVOR=cuda

# The same suite against PyPI's torch wheel (pip's LibTorch, a CUDA build), natively
# on Debian 12, run on this machine's CPU: scripts/pypi-torch makes the venv
# (/var/cache/cohort/venv-torch211 for 2.11.x), fetches Debian 13's Gloo headers,
# configures (Release at -O1), builds and runs scripts/run-tests.
TORCH_PYPI  ?= 2.11.0
PYPI_BUILD  ?= build-pypi-$(TORCH_PYPI)
PYPI_FLAGS  ?= -DCOHORT_WERROR=ON -DCOHORT_BUILD_BENCHMARKS=OFF
test-pypi: deps
	JOBS=$(JOBS) scripts/pypi-torch $(TORCH_PYPI) $(PYPI_BUILD) $(PYPI_FLAGS)

# Only builds (library, launcher, examples, tests), runs nothing: CI's check that the
# newest PyPI release compiles (`make build-pypi TORCH_PYPI=2.15.0`).
build-pypi: deps
	JOBS=$(JOBS) scripts/pypi-torch --no-test $(TORCH_PYPI) $(PYPI_BUILD) $(PYPI_FLAGS)

# The suite under AddressSanitizer and UndefinedBehaviorSanitizer, built with clang
# in build-asan, which also holds the libFuzzer targets (docs/sanitizers.md,
# docs/fuzzing.md). `make fuzz` runs each fuzzer FUZZ_SECONDS on its corpus.
ASAN_BUILD   ?= build-asan
FUZZ_SECONDS ?= 30

# Without precompiled headers: clang's PCH argument keeps the build tree's absolute
# path, so a fresh clone (CI) would miss ccache on every object (Note [ccache
# across clones] in CMakeLists.txt).
$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_CXX_COMPILER=clang++ -DCOHORT_BUILD_FUZZERS=ON \
	  -DCOHORT_BUILD_BENCHMARKS=OFF -DCOHORT_USE_PCH=OFF $(CMAKE_FLAGS)

build-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: build-asan
	scripts/run-sanitized-tests $(ASAN_BUILD)

fuzz: build-asan
	scripts/run-fuzzers $(ASAN_BUILD) $(FUZZ_SECONDS)

# Benchmarks (BENCHMARKS.md): cohort against PyTorch's torch.distributed, DDP
# training against PyTorch's DDP, elastic restarts and rendezvous against torchrun,
# recovery in-process against whole-job restarts, then what cohort's wrapper adds per call.
bench: build
	benchmarks/compare_collectives.sh $(BUILD) 2
	benchmarks/compare_ddp.sh $(BUILD) 2
	benchmarks/compare_trainer.sh $(BUILD) 2
	/usr/bin/python3 benchmarks/compare_elastic.py $(BUILD) 5
	/usr/bin/python3 benchmarks/compare_fault_tolerance.py $(BUILD) 5
	benchmarks/compare_zero_memory.sh $(BUILD)
	benchmarks/compare_zero_throughput.sh $(BUILD)
	benchmarks/compare_powersgd.sh $(BUILD) 2
	benchmarks/compare_op_count.sh $(BUILD)
	$(BUILD)/benchmarks/collectives_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) build-torch2 build-torch2-cuda build-pypi-*

# The two commands of the README: `make demo` and `make test`. Each bootstraps what it needs
# (a virtual environment with torch 2.13 and UCX, GoogleTest from Debian) and is quick when
# nothing changed.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ENV_STAMP := $(VENV)/.torch_ddl_env
EXT_STAMP := build/.extension
CORE_SRCS := $(shell find csrc/core -name '*.cc')
CORE_HDRS := $(shell find csrc/core -name '*.h')
TORCH_SRCS := $(wildcard csrc/torch/*.cpp csrc/torch/*.hpp csrc/torch/cuda/*.cpp csrc/cuda/*.cu csrc/cuda/*.h)
TEST_SRCS := $(wildcard tests/cpp/*.cc) $(wildcard tests/fuzz/*_fuzz.cc)
CXXFLAGS := -std=c++20 -O2 -g -Wall -Wextra -MMD -MP -pthread
# The core is compiled once, position-independent and at the extension's -O3, into build/core:
# the extension (setup.py, TORCH_DDL_CORE_OBJECTS), the C++ tests and the core bench link the same
# objects, so that a cold `make test` compiles each core file once and the tests run the code
# the extension runs.
CORE_OBJS := $(patsubst %.cc,build/core/%.o,$(CORE_SRCS))
CORE_FLAGS := -std=c++20 -O3 -g1 -fPIC -Wall -Wextra -MMD -MP -pthread
OBJS := $(CORE_OBJS) $(patsubst %.cc,build/cpp/%.o,$(TEST_SRCS))
NPROC := $(shell nproc)
CLUSTER_TOOLS := /usr/sbin/ip /usr/sbin/tc

.PHONY: all env build test test-cpp test-cpp-asan test-asan-python test-python test-tsan test-tsan-python fuzz faults demo demo-cluster bench bench-reference bench-cluster peers format clean compat conformance conformance-full sim-scale campaign scale-real bench-scaling test-torch-next test-frameworks bench-data bench-easgd bench-window bench-local-sgd

all: build

env: $(ENV_STAMP)
$(ENV_STAMP):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23" "setuptools>=64" wheel
	$(PY) -m pip install -q torch==2.13.0 libucx-cu13 numpy ninja pytest scikit-learn expecttest hypothesis prometheus_client
	touch $@

build: $(EXT_STAMP)
$(EXT_STAMP): $(ENV_STAMP) $(CORE_SRCS) $(CORE_HDRS) $(TORCH_SRCS) setup.py pyproject.toml tools/find_ucx.py
	$(MAKE) --no-print-directory -j$(NPROC) core-objects \
	  UCX_INC=$$($(PY) tools/find_ucx.py --include) UCX_LIB=$$($(PY) tools/find_ucx.py --lib)
	TORCH_DDL_CORE_OBJECTS=$(CURDIR)/build/core MAX_JOBS=$(NPROC) \
	  $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@mkdir -p build && touch $@

/usr/include/gtest/gtest.h:
	@if [ "$$(id -u)" != 0 ]; then echo "GoogleTest is missing: run 'sudo apt-get install libgtest-dev'" >&2; exit 1; fi
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null

build/cpp/core_tests: $(ENV_STAMP) /usr/include/gtest/gtest.h $(CORE_SRCS) $(CORE_HDRS) $(TEST_SRCS) $(wildcard tests/cpp/*.h tests/fuzz/*.h)
	$(MAKE) --no-print-directory -j$(NPROC) link-tests \
	  UCX_INC=$$($(PY) tools/find_ucx.py --include) UCX_LIB=$$($(PY) tools/find_ucx.py --lib)

.PHONY: link-tests
link-tests: $(OBJS)
	$(CXX) -o build/cpp/core_tests $(OBJS) -pthread -L$(UCX_LIB) -Wl,-rpath,$(UCX_LIB) \
	  -lucp -luct -lucs -lgtest -lgtest_main

build/cpp/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -I$(UCX_INC) -c $< -o $@

.PHONY: core-objects
core-objects: $(CORE_OBJS)

build/core/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CORE_FLAGS) -I$(UCX_INC) -c $< -o $@

-include $(OBJS:.o=.d)

test-cpp: build/cpp/core_tests
	TORCH_DDL_TRACE_FILE= build/cpp/core_tests  # failed ops' flight-recorder dumps: none

# The core's tests under AddressSanitizer (not in `make test`: 3x slower). Adoption's tests are
# left out: they read glibc's chunk headers, which ASan's allocator does not write.
ASAN_OBJS := $(patsubst %.cc,build/asan/%.o,$(CORE_SRCS) $(TEST_SRCS))
test-cpp-asan: $(ENV_STAMP) /usr/include/gtest/gtest.h
	$(MAKE) --no-print-directory -j$(NPROC) build/asan/core_tests \
	  UCX_INC=$$($(PY) tools/find_ucx.py --include) UCX_LIB=$$($(PY) tools/find_ucx.py --lib)
	UCX_MEM_EVENTS=no ASAN_OPTIONS=detect_leaks=0 build/asan/core_tests --gtest_brief=1 \
	  --gtest_filter='-Adopt.*:Direct.Adopt*'

# The core's tests under ThreadSanitizer (not in `make test`: 5 - 15x slower): windows, group
# lifecycles, retries, long runs, wrong bytes and the collectives' own tests, every rank a thread
# with its own progress thread. UCX's own test is left out (UCX is not built for TSan), and so is
# Busy's 1 GiB allreduce (TSan's shadow memory and 10x slower reductions) and adoption (it reads
# glibc's chunk headers, which TSan's allocator does not write, as for ASan).
TSAN_OBJS := $(patsubst %.cc,build/tsan/%.o,$(CORE_SRCS) $(TEST_SRCS))
TSAN_FILTER ?= WindowPaths.*:Window.*:Lifecycle.*:Retry.*:LongRun.*:Wire.*:CallCheck.*:GroupState.*:Reconfigure.*:Collectives.*:Direct.*:SharedRing.*:Memory.*-Direct.Adopt*
test-tsan: $(ENV_STAMP) /usr/include/gtest/gtest.h
	$(MAKE) --no-print-directory -j$(NPROC) build/tsan/core_tests \
	  UCX_INC=$$($(PY) tools/find_ucx.py --include) UCX_LIB=$$($(PY) tools/find_ucx.py --lib)
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" UCX_MEM_EVENTS=no \
	  build/tsan/core_tests --gtest_brief=1 --gtest_filter='$(TSAN_FILTER)'

build/tsan/core_tests: $(TSAN_OBJS)
	$(CXX) -fsanitize=thread -o $@ $(TSAN_OBJS) -pthread -L$(UCX_LIB) -Wl,-rpath,$(UCX_LIB) \
	  -lucp -luct -lucs -lgtest -lgtest_main

build/tsan/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -O1 -fsanitize=thread -I$(UCX_INC) -c $< -o $@

-include $(TSAN_OBJS:.o=.d)

# The real-process tests of windows and groups (every rank a process, torch's glue included)
# under AddressSanitizer or ThreadSanitizer (not in `make test`): the extension built with
# TORCH_DDL_SANITIZE into build/<sanitizer>-ext, which the tests import first (python -P: the
# working directory's torch_ddl does not come before it); every rank loads
# the sanitizer's runtime first, and libstdc++ with it for its interceptors of C++ exceptions to
# find what they wrap (LD_PRELOAD). Python, torch and UCX are not instrumented: what is
# checked is ddl's own code. Adoption is off (it reads glibc's chunk headers, which the
# sanitizers' allocators do not write), and so is ASan's leak check (Python's own allocations);
# UCX's CMA transport is off (it probes a peer with process_vm_readv of the peer's addresses,
# which the sanitizers' interceptor checks as this process's).
SAN_TESTS ?= tests/python/test_window.py tests/python/test_groups.py tests/python/test_shrink.py \
  tests/python/test_reconfigure.py
SAN_FILTER ?=
build/%-ext/.built: $(ENV_STAMP) $(CORE_SRCS) $(CORE_HDRS) $(TORCH_SRCS) setup.py
	rm -rf build/$*-ext/torch_ddl && mkdir -p build/$*-ext
	TORCH_DDL_SANITIZE=$(if $(filter asan,$*),address,thread) MAX_JOBS=$(NPROC) $(PY) setup.py -q \
	  build_ext --build-lib build/$*-ext --build-temp build/$*-ext/tmp 2>&1 | grep -v -i warn || true
	test -n "$$(ls build/$*-ext/torch_ddl/_C*.so)"
	cp torch_ddl/*.py build/$*-ext/torch_ddl/
	touch $@

test-asan-python: build/asan-ext/.built $(CLUSTER_TOOLS)
	PYTHONPATH=$(CURDIR)/build/asan-ext $(PY) -P -c "import importlib.util as u; \
	  o = u.find_spec('torch_ddl').origin; assert o.startswith('$(CURDIR)/build/asan-ext/'), o"
	PYTHONPATH=$(CURDIR)/build/asan-ext \
	  LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UCX_MEM_EVENTS=no UCX_TLS=^cma \
	  TORCH_DDL_SHARE_TENSORS=0 \
	  $(PY) -P -m pytest -q -x -p no:cacheprovider $(SAN_TESTS) $(if $(SAN_FILTER),-k "$(SAN_FILTER)")

test-tsan-python: build/tsan-ext/.built $(CLUSTER_TOOLS)
	PYTHONPATH=$(CURDIR)/build/tsan-ext $(PY) -P -c "import importlib.util as u; \
	  o = u.find_spec('torch_ddl').origin; assert o.startswith('$(CURDIR)/build/tsan-ext/'), o"
	PYTHONPATH=$(CURDIR)/build/tsan-ext \
	  LD_PRELOAD="$$($(CXX) -print-file-name=libtsan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
	  TSAN_OPTIONS="halt_on_error=1 report_signal_unsafe=0 suppressions=$(CURDIR)/tests/tsan.supp" \
	  UCX_MEM_EVENTS=no UCX_TLS=^cma TORCH_DDL_SHARE_TENSORS=0 \
	  setarch $$(uname -m) -R $(PY) -P -m pytest -q -x -p no:cacheprovider $(SAN_TESTS) \
	  $(if $(SAN_FILTER),-k "$(SAN_FILTER)")

build/asan/core_tests: $(ASAN_OBJS)
	$(CXX) -fsanitize=address -o $@ $(ASAN_OBJS) -pthread -L$(UCX_LIB) -Wl,-rpath,$(UCX_LIB) \
	  -lucp -luct -lucs -lgtest -lgtest_main

build/asan/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -O1 -fsanitize=address -fno-omit-frame-pointer -I$(UCX_INC) -c $< -o $@

-include $(ASAN_OBJS:.o=.d)

test-python: build $(CLUSTER_TOOLS)
	$(PY) -m pytest tests/python -q -x -p no:cacheprovider

# The fault suite at full length (make test runs all of it with 6 + 3 random trials and 1
# restart): a random rank of 2 - 4 killed or exiting at a random point of a random collective,
# on one host (30 trials) and across two emulated hosts (30), every survivor naming it within
# 2 - 3 s; SIGSTOP; the mismatch matrix; one rank's bad arguments; abort; torchrun restarts of
# the example (5); PowerSGD and waiting callbacks against gloo; adoption under a memory limit;
# shrink: a random rank killed, then shrink_group and 20 collectives against gloo (30 trials on
# one host, 30 across emulated hosts), and the example's --survive under 3 torchrun nodes; a
# whole host lost among three and the link between two hosts cut, 30 trials each (UCX's TCP
# timers at their defaults: the heartbeats find it; the quorum side shrinks, the other is refused).
faults: build $(CLUSTER_TOOLS)
	DDL_FAULT_TRIALS=$${DDL_FAULT_TRIALS:-30} DDL_CLUSTER_FAULT_TRIALS=$${DDL_CLUSTER_FAULT_TRIALS:-30} \
	DDL_RESTART_TRIALS=$${DDL_RESTART_TRIALS:-5} DDL_SHRINK_TRIALS=$${DDL_SHRINK_TRIALS:-30} \
	DDL_CUT_TRIALS=$${DDL_CUT_TRIALS:-30} \
	$(PY) -m pytest -q -p no:cacheprovider -rA \
	  tests/python/test_faults.py tests/python/test_errors.py tests/python/test_adoption.py \
	  tests/python/test_shrink.py tests/python/test_survive.py \
	  "tests/python/test_cluster.py::test_random_rank_of_two_hosts_dies_then_the_survivors_shrink_and_go_on" \
	  "tests/python/test_cluster.py::test_random_rank_of_two_hosts_dies_at_a_random_point_of_a_random_collective" \
	  "tests/python/test_cluster.py::test_a_rank_on_another_host_that_dies_or_is_cut_off_fails_the_survivors_in_seconds" \
	  "tests/python/test_cluster.py::test_a_host_cut_off_the_quorum_side_shrinks_and_goes_on_the_other_is_refused" \
	  "tests/python/test_launch.py::test_the_example_resumes_after_a_rank_fails_under_torchrun_restarts" \
	  "tests/python/test_launch.py::test_torchrun_restarts_a_job_whose_rank_failed" \
	  "tests/python/test_launch.py::test_destroy_and_init_again_in_the_same_processes" \
	  tests/python/test_ddp.py -k "not test_ddp_matches_gloo or power_sgd"

# Fuzzing (docs/testing.md): every target in tests/fuzz (one per decoder of bytes from a peer or
# the store) under clang's libFuzzer with ASan and UBSan, FUZZ_SECONDS each (default 600). Inputs
# that reach new code are merged into tests/fuzz/corpus/<target>/, an input that fails is kept in
# tests/fuzz/crashes/<target>/; core_tests replays both (Fuzz.CorporaReplay).
FUZZ_TARGETS := $(patsubst tests/fuzz/%_fuzz.cc,%,$(wildcard tests/fuzz/*_fuzz.cc))
FUZZ_SECONDS ?= 600
FUZZ_FLAGS := -std=c++20 -O1 -g -pthread -fno-omit-frame-pointer -fsanitize=address,undefined \
  -fno-sanitize-recover=undefined
FUZZ_OBJS := $(patsubst %.cc,build/fuzz/%.o,$(CORE_SRCS))
# clang 16: clang 14 fails on the core's coroutines with UBSan and coverage together ("cannot
# represent a difference across sections").
FUZZ_CXX := /usr/bin/clang++-16
$(FUZZ_CXX):
	@if [ "$$(id -u)" != 0 ]; then echo "fuzzing needs clang 16: run 'sudo apt-get install clang-16'" >&2; exit 1; fi
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-16 >/dev/null

fuzz: $(ENV_STAMP) $(FUZZ_CXX)
	$(MAKE) --no-print-directory -j$(NPROC) $(addprefix build/fuzz/,$(FUZZ_TARGETS)) \
	  UCX_INC=$$($(PY) tools/find_ucx.py --include) UCX_LIB=$$($(PY) tools/find_ucx.py --lib)
	set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p build/fuzz/corpus/$$t tests/fuzz/corpus/$$t tests/fuzz/crashes/$$t; \
	  UCX_MEM_EVENTS=no ASAN_OPTIONS=detect_leaks=1 build/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) \
	    -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=tests/fuzz/crashes/$$t/ \
	    build/fuzz/corpus/$$t tests/fuzz/corpus/$$t 2>&1 | tail -n 12; \
	  build/fuzz/$$t -merge=1 tests/fuzz/corpus/$$t build/fuzz/corpus/$$t 2>&1 | tail -n 1; \
	done

build/fuzz/%: tests/fuzz/%_fuzz.cc $(FUZZ_OBJS)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer -DDDL_LIBFUZZER -I$(UCX_INC) $< $(FUZZ_OBJS) -o $@ \
	  -L$(UCX_LIB) -Wl,-rpath,$(UCX_LIB) -lucp -luct -lucs

build/fuzz/%.o: %.cc
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -I$(UCX_INC) -c $< -o $@

-include $(FUZZ_OBJS:.o=.d)
.SECONDARY: $(FUZZ_OBJS)

# PyTorch's own distributed suite, all of it, over ddl at world size 2 (about a minute): the
# ranks of each test forked from the process that imported the suite (CONFORMANCE_START=fork;
# spawned, as PyTorch's CI starts them, each test took 6 s). conformance-full spawns them.
conformance: build
	CONFORMANCE_START=fork tests/conformance/run.sh full ddl 2

# The whole suite over ddl and gloo at world sizes 2 and 3 (about 20 minutes per run here).
conformance-full: build
	tests/conformance/run.sh full "ddl gloo" "2 3"

test: test-cpp test-python conformance

demo: build
	$(VENV)/bin/torchrun --nproc_per_node=2 --master_port=$${DEMO_PORT:-29517} examples/train_digits.py --backend ddl --epochs 8

bench: build
	$(PY) benchmarks/allreduce_bench.py --world-size 2

# Across hosts emulated with network namespaces (root; iproute2): 2x2 and 2x4 hosts x ranks at
# 1 Gbit/s, and 2 racks x 2 hosts x 2 ranks behind 500 Mbit/s uplinks. Tables and PNGs go to
# benchmarks/results/ (about 15 minutes on 2 cores).
$(CLUSTER_TOOLS):
	@if [ "$$(id -u)" != 0 ]; then echo "note: emulating hosts needs root and iproute2" >&2; exit 0; fi; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null

# torch_ddl.data.InMemoryDataset against the files read from disk and each rank's own copy:
# 4 ranks, 256 MiB of JPEG decoded in 2 workers per rank, then in the ranks (docs/training.md).
bench-data: build
	$(PY) -c "import PIL" 2>/dev/null || $(PY) -m pip install -q pillow
	@mkdir -p benchmarks/results
	set -o pipefail; ($(PY) benchmarks/data_bench.py && $(PY) benchmarks/data_bench.py --workers 0) \
	  | tee benchmarks/results/data_bench.txt
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q matplotlib
	$(PY) benchmarks/plot_training.py

# Sync EASGD against DDP across 2 emulated hosts x 2 ranks at 1 Gbit/s (root).
bench-easgd: build $(CLUSTER_TOOLS)
	@mkdir -p benchmarks/results
	set -o pipefail; $(PY) benchmarks/easgd_bench.py | tee benchmarks/results/easgd_bench.txt
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q matplotlib
	$(PY) benchmarks/plot_training.py

# One-sided puts against send/recv of the same bytes: 2 ranks on this host, then 1 rank on each
# of 2 emulated hosts at 1 Gbit/s (root). About 2 minutes.
# DDP, the EASGDs and DiLoCo (plain, streaming, bfloat16 and int8 on the wire) across 2 x 2
# emulated hosts at 1 Gbit/s and 100 Mbit/s, two tasks; then Hogwild EASGD beside the other
# EASGDs on one host of 4 ranks (root; about 15 minutes).
bench-local-sgd: build $(CLUSTER_TOOLS)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q matplotlib
	@mkdir -p benchmarks/results
	set -o pipefail; $(PY) benchmarks/local_sgd_bench.py --json benchmarks/results/local_sgd.json \
	  | tee benchmarks/results/local_sgd.txt
	$(PY) benchmarks/plot_local_sgd.py
	set -o pipefail; $(PY) benchmarks/local_sgd_bench.py --shape 1x4 --rates 1gbit \
	  --methods easgd,async-easgd,async-measgd,hogwild,diloco \
	  --json benchmarks/results/local_sgd_one_host.json | tee benchmarks/results/local_sgd_one_host.txt

bench-window: build $(CLUSTER_TOOLS)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q matplotlib
	@mkdir -p benchmarks/results
	set -o pipefail; $(PY) benchmarks/window_bench.py --both --png benchmarks/results/window.png \
	  | tee benchmarks/results/window.txt

bench-cluster: build $(CLUSTER_TOOLS)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q matplotlib
	@mkdir -p benchmarks/results
	set -o pipefail; for shape in 2x2 2x4 2x2x2; do \
	  $(PY) benchmarks/cluster/bench.py --shape $$shape --png benchmarks/results/cluster_$$shape.png \
	    | tee benchmarks/results/cluster_$$shape.txt || exit 1; \
	done

# The demo's training across 2 emulated hosts of 2 ranks (torchrun on each host).
demo-cluster: build $(CLUSTER_TOOLS)
	$(PY) benchmarks/cluster/cluster.py --hosts 2 --ranks 2 --rate 1gbit --torchrun -- \
	  examples/train_digits.py --backend ddl --epochs 4

# The simulator at scale (docs/sim.md): 1 024 ranks (4 per host, 8 hosts per rack), a 100 MB
# allreduce with the auto plan, then with rank 517 killed halfway, and 4 096 ranks at 100 MB, 1,
# 4 and 16 MiB; then the cost model against the simulator over shapes and sizes, for auto's pick
# and for every candidate plan of up to 2 colours (about an hour and a half).
sim-scale: build
	@mkdir -p benchmarks/results
	set -o pipefail; for run in "--ranks 1024 --bytes 100M" "--ranks 1024 --bytes 100M --kill 517@0.5" \
	    "--ranks 4096 --bytes 100M" "--ranks 4096 --bytes 1M" "--ranks 4096 --bytes 4M" \
	    "--ranks 4096 --bytes 16M"; do \
	  echo "python -m torch_ddl.sim $$run --ranks-per-host 4 --hosts-per-rack 8"; \
	  TORCH_DDL_TRACE_ENTRIES=0 $(PY) -m torch_ddl.sim $$run --ranks-per-host 4 --hosts-per-rack 8 \
	    --verbose || exit 1; \
	done | tee benchmarks/results/sim_scale.txt
	set -o pipefail; $(PY) benchmarks/sim_vs_model.py | tee benchmarks/results/sim_vs_model.txt
	set -o pipefail; $(PY) benchmarks/sim_vs_model.py --candidates --max-colors 2 \
	  | tee benchmarks/results/sim_vs_model_candidates.txt

# The fault campaign (docs/faults.md): 10 000 scenarios drawn from seed 1, 8 to 1 024 ranks,
# every invariant checked; then the bars of scale: a host of 1 024 ranks killed, two halves of 512
# partitioned, each followed by the shrink (under an hour).
campaign: build
	@mkdir -p benchmarks/results
	set -o pipefail; $(PY) -m torch_ddl.sim --campaign $${DDL_CAMPAIGN:-10000} --seed $${DDL_CAMPAIGN_SEED:-1} \
	  | tee benchmarks/results/campaign.txt
	set -o pipefail; for run in "--ranks 1024 --bytes 16M --kill 516-519@0.5 --shrink" \
	    "--ranks 512 --bytes 1M --partition 256-511@0.5 --shrink"; do \
	  echo "python -m torch_ddl.sim $$run --ranks-per-host 4 --hosts-per-rack 8"; \
	  TORCH_DDL_TRACE_ENTRIES=0 $(PY) -m torch_ddl.sim $$run --ranks-per-host 4 --hosts-per-rack 8 \
	    || exit 1; \
	done | tee benchmarks/results/campaign_scale.txt
	@# Scenarios once found failing that take minutes each (make test holds the quick ones).
	set -o pipefail; for seed in cf2d6aedfdc5ece8; do \
	  $(PY) -m torch_ddl.sim --scenario $$seed | tail -1 || exit 1; \
	done | tee -a benchmarks/results/campaign_scale.txt

# The scaling study (docs/scaling.md): DDP's weak-scaling efficiency for ResNet-50/101 from 4 to
# 1 024 GPUs, from the simulator, beside three published results (about an hour; cached).
bench-scaling: build
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q matplotlib
	set -o pipefail; $(PY) benchmarks/scaling.py --cache benchmarks/results/scaling_cache.json \
	  --json benchmarks/results/scaling.json --png benchmarks/results/scaling.png \
	  | tee benchmarks/results/scaling.txt

# 32 real ranks on 4 emulated hosts of 8 (root): creation against gloo's, every collective
# against gloo, the endpoints each rank opened (about 10 minutes); then 32 on 16 hosts of 2,
# whose allreduces take the host level split in two, against gloo's.
scale-real: build $(CLUSTER_TOOLS)
	DDL_SCALE=1 $(PY) -m pytest -q -s -p no:cacheprovider \
	  "tests/python/test_cluster.py::test_thirty_two_ranks_on_four_hosts_create_as_fast_as_gloo_and_match_it" \
	  "tests/python/test_cluster.py::test_sixteen_hosts_take_their_level_split_in_two_and_match_gloo"

# Pinned and not, then the same with torch's CPU tensors from shared memory (docs/shared-memory.md).
bench-reference: build peers build/bench/core_bench
	$(PY) benchmarks/allreduce_bench.py --world-size 2 --reference --pin
	$(PY) benchmarks/allreduce_bench.py --world-size 2 --reference
	TORCH_DDL_SHARED_ALLOCATOR=1 $(PY) benchmarks/allreduce_bench.py --world-size 2 --reference --pin --no-shared
	TORCH_DDL_SHARED_ALLOCATOR=1 $(PY) benchmarks/allreduce_bench.py --world-size 2 --reference --no-shared

# ddl's core alone, with no torch on the path (benchmarks/core_bench.cc): the Communicator's
# allreduce over UCX, timed as the references time theirs, on the objects the extension links.
build/bench/core_bench: $(ENV_STAMP) $(CORE_SRCS) $(CORE_HDRS) benchmarks/core_bench.cc
	$(MAKE) --no-print-directory -j$(NPROC) link-core-bench \
	  UCX_INC=$$($(PY) tools/find_ucx.py --include) UCX_LIB=$$($(PY) tools/find_ucx.py --lib)

.PHONY: link-core-bench
link-core-bench: $(CORE_OBJS) build/cpp/benchmarks/core_bench.o
	@mkdir -p build/bench
	$(CXX) -o build/bench/core_bench $^ -pthread -L$(UCX_LIB) -Wl,-rpath,$(UCX_LIB) \
	  -lucp -luct -lucs

-include build/cpp/benchmarks/core_bench.d

# The CPU peers, from PyPI's wheels into build/peers (about 250 MB): Intel's oneCCL 2022.1.2
# and Intel MPI 2021.18.1, and their allreduce benchmarks (benchmarks/reference/ccl_allreduce.cc,
# mpi_allreduce.cc against Intel MPI). The oneccl-cpu wheels lack libccl.so.2, which
# libccl.so.1 needs: it is taken from the full oneccl wheel of the same version.
PEERS := build/peers
PEERS_LIB = $(abspath $(PEERS)/venv/lib)
PEER_FLAGS = -std=c++17 -O2 -I$(PEERS)/venv/include -L$(PEERS_LIB) -Wl,--disable-new-dtags \
  -Wl,-rpath,$(PEERS_LIB) -Wl,-rpath-link,$(PEERS_LIB)
.PHONY: peers
peers: $(PEERS)/bin/ccl_allreduce $(PEERS)/bin/impi_allreduce
$(PEERS)/.installed:
	rm -rf $(PEERS)/venv $(PEERS)/wheels
	python3 -m venv $(PEERS)/venv
	$(PEERS)/venv/bin/python -m pip install -q --no-deps oneccl-cpu==2022.1.2 \
	  oneccl-cpu-devel==2022.1.2 impi-rt==2021.18.1 impi-devel==2021.18.1
	$(PEERS)/venv/bin/python -m pip download -q --no-deps oneccl==2022.1.2 -d $(PEERS)/wheels
	$(PEERS)/venv/bin/python tools/extract_wheel_libs.py $(PEERS)/wheels/oneccl-2022.1.2-*.whl \
	  'libccl.so.2*' $(PEERS_LIB)
	touch $@
$(PEERS)/bin/ccl_allreduce: benchmarks/reference/ccl_allreduce.cc $(PEERS)/.installed
	@mkdir -p $(dir $@)
	$(CXX) $(PEER_FLAGS) -o $@ $< -lccl -lmpi
$(PEERS)/bin/impi_allreduce: benchmarks/reference/mpi_allreduce.cc $(PEERS)/.installed
	@mkdir -p $(dir $@)
	$(CXX) $(PEER_FLAGS) -o $@ $< -lmpi

format:
	clang-format -i $(CORE_SRCS) $(CORE_HDRS) $(TORCH_SRCS) $(TEST_SRCS) $(wildcard tests/cpp/*.h) \
	  $(wildcard benchmarks/*.cc benchmarks/reference/*.cc benchmarks/reference/*.h)

clean:
	rm -rf build torch_ddl/_C*.so *.egg-info

# The Python suite and the conformance subset under another torch: TORCH_NEXT (2.15.0; `make
# test-torch-next TORCH_NEXT=2.14.1` for the one before), in an environment of its own with a
# copy of the tree installed in it (editable). 2.15.0 is not among the releases on this machine's
# disk: pip fetches it from PyPI past the local cap (/etc/xdg/pip/constraints.txt), several GB
# with its CUDA libraries (it runs on the CPU here). Not part of make test.
TORCH_NEXT ?= 2.15.0
VENV_NEXT = .venv-$(TORCH_NEXT)
NEXT_TREE = build/next-$(TORCH_NEXT)
test-torch-next: $(CLUSTER_TOOLS)
	test -x $(VENV_NEXT)/bin/python || { python3 -m venv $(VENV_NEXT) && \
	  $(VENV_NEXT)/bin/python -m pip install -q --upgrade "pip>=23" "setuptools>=64" wheel && \
	  PIP_CONSTRAINT=/dev/null $(VENV_NEXT)/bin/python -m pip install -q torch==$(TORCH_NEXT) \
	    libucx-cu13 numpy ninja pytest scikit-learn expecttest hypothesis; }
	mkdir -p $(NEXT_TREE)
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(NEXT_TREE)
	cd $(NEXT_TREE) && TORCH_DDL_CUDA=0 MAX_JOBS=$(NPROC) $(CURDIR)/$(VENV_NEXT)/bin/python \
	  -m pip install -q --no-build-isolation --no-deps -e .
	cd $(NEXT_TREE) && $(CURDIR)/$(VENV_NEXT)/bin/python -m pytest tests/python -q -x \
	  -p no:cacheprovider
	cd $(NEXT_TREE) && PYTHON=$(CURDIR)/$(VENV_NEXT)/bin/python tests/conformance/run.sh \
	  subset ddl 2

# Training frameworks over ddl against gloo (tests/frameworks): Lightning's DDPStrategy, DeepSpeed
# ZeRO 1 and 2, torchtitan's calls with FSDP2 on a 2-D mesh. Their installs are large, so they
# live in an environment of their own (the same torch as .venv, so the build in place serves
# both). Not part of make test.
FRAMEWORKS_VENV := .venv-frameworks
test-frameworks: build
	test -x $(FRAMEWORKS_VENV)/bin/python || { python3 -m venv $(FRAMEWORKS_VENV) && \
	  $(FRAMEWORKS_VENV)/bin/python -m pip install -q --upgrade "pip>=23" "setuptools>=64" wheel && \
	  $(FRAMEWORKS_VENV)/bin/python -m pip install -q torch==2.13.0 libucx-cu13 numpy ninja \
	    pytest lightning && \
	  $(FRAMEWORKS_VENV)/bin/python -m pip install -q --no-build-isolation deepspeed; }
	PYTHONPATH=$(CURDIR) $(FRAMEWORKS_VENV)/bin/python -m pytest tests/frameworks -q -rs \
	  -p no:cacheprovider

# The glue against torch 2.11's headers (the version on GPU machines) and 2.15's, and the CUDA
# part where nvcc is found; downloads ~0.5 GB once per version.
compat: $(ENV_STAMP)
	tools/check_torch_headers.sh 2.11.0
	tools/check_torch_headers.sh 2.15.0

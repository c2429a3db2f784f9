# One entry point for set-up, tests and experiments. Every target depends on the
# venv stamp, so a fresh clone installs on first use and never twice.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
REQS   := requirements/cpu.txt requirements/cpu-lock.txt pyproject.toml

export OMP_NUM_THREADS ?= 1

SCALE   ?= tiny
CLUSTER ?= local
DRY_RUN ?= 0
# ALLOW_BUSY=1: let benchmarks time beside studies/tests (disturbed rounds are marked noisy)
BUSY    := $(if $(filter 1,$(ALLOW_BUSY)),--allow-busy)

.PHONY: setup test test-slow lint prepare prefetch reproduce-table quality-study peers-study clean-venv

setup: $(STAMP)

# The editable install writes the project's egg-info into the tree: .ci/run builds both venvs
# at once, so each takes this lock around it (flock, where the system has it).
LOCKED := $(if $(shell command -v flock),flock .install.lock)

$(STAMP): $(REQS) pyproject.toml
	@echo ">> creating $(VENV) and installing pinned dependencies (first run only, ~3 min)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/cpu.txt -c requirements/cpu-lock.txt
	$(LOCKED) $(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@echo ">> fetching the offline GPT-2 BPE asset (pinned sha256; see data_prep/assets.py)"
	$(PY) -m data_prep.assets
	@touch $(STAMP)

# make test: every test but the whole-stage and study runs (marked slow), on PYTEST_WORKERS
# processes, each test file on one worker (its module fixtures, e.g. one 2-rank Megatron
# suite, are built once). make test-slow: the slow ones (a full stage, a study's quick run,
# a resume after SIGKILL through the CLI); .ci/run runs both.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)

test: $(STAMP)
	$(PY) -m pytest -q --durations=10 $(XDIST) -m "not slow" tests

test-slow: $(STAMP)
	$(PY) -m pytest -q --durations=10 $(XDIST) -m slow tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Prepare a corpus as Megatron indexed datasets (default: the offline Wikipedia sample).
# Hydra overrides go in ARGS, e.g. make prepare ARGS="data=openwebtext tokenizer=gpt2"
prepare: $(STAMP)
	$(PY) -m pipelines.prepare $(ARGS)

# For clusters whose compute nodes have no internet: run on a login node to fill the shared
# Hugging Face cache (cluster.hf_home, else $$HF_HOME) with the paper experiments' corpora and
# tokenizers and the lm-eval task data; the Slurm jobs then read it offline. Idempotent.
# DRY_RUN=1 lists what it would fetch; ARGS e.g. "experiments=[gpt345m_owt_quality] hf_home=/path".
prefetch: $(STAMP)
	$(PY) -m pipelines.prefetch $(if $(filter 1,$(DRY_RUN)),dry_run=true) $(ARGS)

# The main job. Default: tiny GPT + tiny Llama x {AdamW, AdamS, SCAPE-90, SCAPE-99} on 2 local
# CPU ranks, offline (~15-20 min on 2 cores). SCALE=paper CLUSTER=vista submits the paper's
# sweeps to Slurm with submitit (DRY_RUN=1: write the sbatch scripts, submit nothing).
# W&B logs offline unless WANDB_API_KEY is set. Extra Hydra overrides for every run go in ARGS.
# The efficiency table has bytes, no speed columns: speed is `make bench-step`'s.
reproduce-table: $(STAMP)
	$(PY) -m pipelines.reproduce --scale $(SCALE) --cluster $(CLUSTER) $(if $(filter 1,$(DRY_RUN)),--dry-run) $(ARGS)

# Performance (issues 6, 14): one entry point per target, python -m benchmarks.<name> (their
# machinery in benchmarks/harness/). bench: bytes, optimizer overhead, the pretrain stage's
# Megatron step on the emulated cluster and its floor by part (network namespaces: run as
# root, else the sweep writes why it skipped), projection, break-even map, README. The step
# sweep stops starting rounds after 60 min (--budget-min). Every timing benchmark refuses to
# start beside a study, the tests or another benchmark (ALLOW_BUSY=1 overrides; disturbed
# rounds are re-run and, if still disturbed, marked noisy). Writes results/bench/*.json,
# break_even.* and results/bench/README.md.
.PHONY: bench bench-bytes bench-overhead bench-step bench-floor-parts bench-break-even bench-project bench-report bench-peers-cluster
bench: $(STAMP)
	$(PY) -m benchmarks.bytes $(BUSY)
	$(PY) -m benchmarks.overhead $(BUSY)
	$(PY) -m benchmarks.megatron_step $(BUSY)
	$(PY) -m benchmarks.megatron_step --parts $(BUSY)
	$(PY) -m benchmarks.projection
	$(PY) -m benchmarks.break_even
	$(PY) -m benchmarks.report

bench-bytes: $(STAMP)
	$(PY) -m benchmarks.bytes $(BUSY) $(ARGS)

bench-overhead: $(STAMP)
	$(PY) -m benchmarks.overhead $(BUSY) $(ARGS)

# Issue 14: the pretrain stage's Megatron train step (dense AdamS with and without Megatron's
# overlap, SCAPE-90, SCAPE-99) on 2 and 4 ranks at 100 Mbit/s, 1 and 10 Gbit/s, each method
# in rank processes of its own with its compute-only floor launched right after its steps.
# Writes results/bench/megatron_step.json after every round. Two launches per method and
# round, half the earlier harness's four; not yet timed at this commit (that harness took
# 45-65 min). ARGS e.g. "--worlds 2 --rates-mbit 1000 --methods 'scape-*' dense-overlap".
bench-step: $(STAMP)
	$(PY) -m benchmarks.megatron_step $(BUSY) $(ARGS)

# Where the sweep model's compute-only step goes, part by part (forward, backward, SCAPE's
# pack / commit / update / select spans under torch.profiler), 2 ranks, dense AdamS and
# SCAPE-90/99. Writes results/bench/floor_parts.json. ~2 min. ARGS e.g. "--worlds 4".
bench-floor-parts: $(STAMP)
	$(PY) -m benchmarks.megatron_step --parts $(BUSY) $(ARGS)

# The break-even map (the projection over bandwidth x tokens per GPU, and the dense comm /
# compute ratio the paper's x3.26 needs): results/bench/break_even.{png,md,csv,json}. Seconds.
bench-break-even: $(STAMP)
	$(PY) -m benchmarks.break_even $(ARGS)

# Issue 8: the pretrain stage's step time (experiment=peers_gpt345m_owt, scale=tiny; its
# engine.step, the trainer's step_time) for every optimizer of the peers sweep, on the
# emulated cluster (root, else skipped with a message). Writes results/peers/cluster.json.
# Defaults: 2 ranks, 1 Gbit/s, 30 steps (the first 7 left out), 2 repeats: 18 runs; not yet
# timed with this harness (the earlier whole-trainer runs took ~10 min on 2 shared cores).
# ARGS e.g. "--methods adams scape99 dgc99 --repeats 3".
bench-peers-cluster: $(STAMP)
	@test -f data/enwiki_sample__bytebpe4k/metadata.json || $(PY) -m pipelines.prepare progress=false
	$(PY) -m benchmarks.peers_cluster --ranks 2 --rate-mbit 1000 --steps 30 --repeats 2 --out results/peers/cluster.json $(BUSY) $(ARGS)

bench-project: $(STAMP)
	$(PY) -m benchmarks.projection $(ARGS)

bench-report: $(STAMP)
	$(PY) -m benchmarks.report $(ARGS)

# Quality study (issue 7): SCAPE vs dense AdamW/AdamS at 90/99% sparsity, with ablations.
# Writes results/quality/ and resumes (finished runs are skipped); a few hours on 2 cores.
# QUICK=1: a minutes-long version into outputs/quality_quick/. Hydra overrides go in ARGS.
# Its data is the embedded corpus with a 1,024-entry byte-level BPE, prepared on first use.
QUALITY_DATA := data/enwiki_sample__bytebpe1k
quality-study: $(STAMP)
	@test -f $(QUALITY_DATA)/metadata.json || $(PY) -m pipelines.prepare tokenizer=bytebpe1k
	$(PY) -m pipelines.quality_study $(if $(QUICK),quick=true) data_dir=$(QUALITY_DATA) $(ARGS)

# The verdict's finalists (issue 27) at one code version: dense AdamS and AdamW, SCAPE-90/99,
# 3 seeds, each cell's lr grid closed (a 3-point grid, extended x0.5 / x2 on every seed while
# the choice, the lowest mean final loss over the seeds, sits at an edge). One horizon per
# call (VERDICT_STEPS: 300, 1500, 3000), one process per model: `make -j2 quality-verdict
# VERDICT_STEPS=300`. Runs land in results/quality/runs/<code version>/ and resume. About
# 100 runs per horizon: 300 steps ~45 min on 2 cores, 1,500 ~4 h, 3,000 ~8 h.
VERDICT_STEPS  ?= 300
VERDICT_GRID   ?= [0.25,0.5,1]
VERDICT_MODELS := llama gpt
.PHONY: quality-verdict quality-queue quality-replay quality-report quality-archive quality-replay-host quality-transfer quality-product-path $(VERDICT_MODELS:%=quality-verdict-%)
quality-verdict: $(VERDICT_MODELS:%=quality-verdict-%)
$(VERDICT_MODELS:%=quality-verdict-%): quality-verdict-%: $(STAMP)
	@test -f $(QUALITY_DATA)/metadata.json || $(PY) -m pipelines.prepare tokenizer=bytebpe1k
	$(PY) -m pipelines.quality_study data_dir=$(QUALITY_DATA) report=false scale.steps=$(VERDICT_STEPS) \
	  'only_models=[$*]' 'only_variants=[adams,adamw,scape90,scape99]' 'seeds=[0,1,2]' \
	  'lr_scales=$(VERDICT_GRID)' close_grids=4 $(ARGS)

# Every run the verdict still needs (issue 27), as ordered resumable batches (conf/quality_queue.yaml),
# each run by 2 worker processes that split its runs; hours in all on 2 cores, run it in the
# background and never beside a benchmark: `make quality-queue ARGS="'only=[bf16_1500]'"`.
quality-queue: $(STAMP)
	@test -f $(QUALITY_DATA)/metadata.json || $(PY) -m pipelines.prepare tokenizer=bytebpe1k
	$(PY) -m pipelines.quality_queue data_dir=$(QUALITY_DATA) $(ARGS)

# After a change to a file of the step's source (pipelines/studies/protocol.py, STEP_SOURCES):
# replay one run per (model, method) of each older code version with today's code (minutes).
# Same bits in every logged record: results/quality/runs/equivalent.json joins the versions,
# and their runs share the tables; any difference: the older runs stay apart (re-run them).
quality-replay: $(STAMP)
	@test -f $(QUALITY_DATA)/metadata.json || $(PY) -m pipelines.prepare tokenizer=bytebpe1k
	$(PY) -m pipelines.quality_study replay=true data_dir=$(QUALITY_DATA) $(ARGS)

# The same replay with both sides made on this host (a host with another CPU can miss the
# older code's own stored bits): OLDER=<commit of the older code version>, after quality-replay,
# or SETS=<stored versions>, e.g. SETS=1bfbfa29a43b,cb351f3e9a0f (the 13 cheap runs, about
# 12 minutes a side), to make today's side of just those versions first.
quality-replay-host: $(STAMP)
	$(PY) -m pipelines.studies.host_replay $(OLDER) --data-dir $(QUALITY_DATA) $(if $(SETS),--sets $(SETS))

# Does the recipe's per-family lr rule hold where users meet it (make reproduce-table's setting,
# 2 seeds, x1 against the rule)? Writes results/quality/transfer_check.json (minutes), which
# make quality-report carries to recipe.json and the configs' test. RAMP=1: the density ramp's
# check (SCAPE-99 with and without it there; results/quality/ramp_transfer.json). GRID=1: every
# arm on a closed multiplier grid there, on its corpus (results/early_gap/transfer_grid.json,
# ~1 h on 2 cores, resumes).
quality-transfer: $(STAMP)
	$(PY) -m pipelines.studies.transfer_check $(if $(filter 1,$(RAMP)),--ramp --runs outputs/ramp_transfer) $(if $(filter 1,$(GRID)),--grid)

# Does the verdict carry over to what users run? The finalists at 300 steps, 3 seeds, on the
# study's path and on a user's train.engine=simulator path (Megatron's layout, scheduler and
# micro-batches), side by side: results/quality/product_path/ (about 15 min on one core;
# ARGS="--report-only" rebuilds the table from the committed runs).
quality-product-path: $(STAMP)
	@test -f $(QUALITY_DATA)/metadata.json || $(PY) -m pipelines.prepare tokenizer=bytebpe1k
	$(PY) -m pipelines.studies.product_path $(ARGS)

# Pack finished run logs into one xz tar per code version (results/quality/runs/<version>.tar.xz,
# about a tenth of the bytes); the reports, the queue and the replay read them packed. Run it
# after a batch has finished, before committing its runs; folders still being written are skipped.
quality-archive: $(STAMP)
	$(PY) -m pipelines.studies.run_store results/quality/runs

# Rewrite results/quality/summary.md, runs.csv and figures from the finished runs (seconds).
quality-report: $(STAMP)
	$(PY) -m pipelines.quality_study report_only=true data_dir=$(QUALITY_DATA)

# Peers (issues 8, 29): the loss-for-bytes frontier of dense AdamS and AdamW, SCAPE-90/99,
# PowerSGD r1/2/4, DGC-90/99 (with its warm-up) and 1-bit Adam through the pretrain stage under
# the verdict's protocol: lr grid x1/x2/x4 closed on every seed, 3 seeds, one code version
# (conf/peers_study.yaml: 1,024-entry BPE, 400 steps). 90 runs plus the grids' extensions
# (3 per method and round; the 2026-12-04 study ran 39 more in 4 rounds, 129 in all):
# ~50 s a run on the idle 2-core host (2026-12-04: seed 1234's 30 runs in 24 min), so
# ~2 h; about 4x that beside another job. Resumes: run it
# in the background (nohup make peers-study > peers.log 2>&1 &), again after a stop. Writes
# results/peers/ (frontier.*, its README block); runs in runs/peers/<code version>/.
# QUICK=1: AdamS and DGC-99, one seed, one lr, 6 steps, into outputs/peers_quick/ (minutes).
PEERS_BPE = $(if $(QUICK),bytebpe4k,bytebpe1k)
peers-study: $(STAMP)
	@test -f data/enwiki_sample__$(PEERS_BPE)/metadata.json || $(PY) -m pipelines.prepare tokenizer=$(PEERS_BPE) progress=false
	$(PY) -m pipelines.peers_study $(if $(QUICK),quick=true output_root=outputs/peers_quick/runs out_dir=outputs/peers_quick) $(ARGS)

# Issue 28: the adapter on today's megatron-core (0.19.2: what environment.yml pins for
# clusters), beside the 0.16.1 of .venv. A second venv, .venv-mcore019, from the same lock
# with megatron-core swapped. megatron-core 0.17 and newer publish only CPython 3.12 wheels,
# and this machine has 3.11: the 0.19.2 wheel (sha256-pinned in requirements/mcore-latest.txt)
# is unpacked into the 3.11 venv, with triton (0.19 imports it with megatron.core), and its
# one compiled module, the dataset helpers (built for 3.12), is rebuilt for 3.11 from the C++
# source the wheel ships (pybind11, g++). Its Python code then runs unchanged: this exercises
# every Megatron API the adapter touches, on the same torch, though not the cluster user's
# interpreter (scripts/gpu_check.sh runs it on 3.12). Runs every Megatron test (tests/megatron:
# dense AdamW/AdamS, SCAPE at 2 and 4 ranks, the simulator bit-identity, checkpoint/resume in
# fresh processes, the fused exchange, the CPU layer's scope) and the pretrain stage's
# SIGKILL-and-resume run through Megatron (~5 min after a ~5 min first build).
MCORE_VENV   := .venv-mcore019
MCORE_PY     := $(MCORE_VENV)/bin/python
MCORE_STAMP  := $(MCORE_VENV)/.installed
MCORE_EXTRA  := triton==3.6.0 pybind11==3.1.0
MCORE_TESTS  := tests/megatron tests/pipelines/test_pretrain.py
.PHONY: test-mcore-latest gpu-wheels gpu-corpus

$(MCORE_STAMP): $(REQS) requirements/mcore-latest.txt
	@echo ">> creating $(MCORE_VENV): the pinned lock with megatron-core 0.19.2 (first run only, ~5 min)"
	$(PYTHON) -m venv $(MCORE_VENV)
	$(MCORE_PY) -m pip install --quiet --upgrade pip
	grep -v '^megatron-core' requirements/cpu.txt > $(MCORE_VENV)/cpu.txt
	grep -v '^megatron-core' requirements/cpu-lock.txt > $(MCORE_VENV)/cpu-lock.txt
	$(MCORE_PY) -m pip install --quiet -r $(MCORE_VENV)/cpu.txt $(MCORE_EXTRA) -c $(MCORE_VENV)/cpu-lock.txt
	$(MCORE_PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		-r requirements/mcore-latest.txt -d $(MCORE_VENV)/wheels
	$(MCORE_PY) -c "import glob, sysconfig, zipfile; \
		zipfile.ZipFile(*glob.glob('$(MCORE_VENV)/wheels/megatron_core-*.whl')).extractall(sysconfig.get_paths()['purelib'])"
	cd "$$($(MCORE_PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/megatron/core/datasets" && \
		g++ -O3 -Wall -shared -std=c++17 -fPIC $$($(CURDIR)/$(MCORE_PY) -m pybind11 --includes) helpers.cpp \
		-o helpers_cpp$$($(CURDIR)/$(MCORE_PY) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
	$(LOCKED) $(MCORE_PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(MCORE_PY) -m data_prep.assets
	@touch $(MCORE_STAMP)

test-mcore-latest: $(MCORE_STAMP)
	$(MCORE_PY) -c "from importlib.metadata import version; print('>> megatron-core', version('megatron-core'))"
	$(MCORE_PY) -m pytest -q --durations=10 $(XDIST) $(MCORE_TESTS)

# For the GPU check on a machine without network: fetch the hash-pinned megatron-core wheel
# for CPython 3.12 into vendor/wheels/ (gitignored), where scripts/gpu_check.sh installs it
# from (pip checks the hash again). ARCH=aarch64 for TACC Vista's Grace nodes.
ARCH ?= x86_64
# The non-repeating offline corpus (issue 52): debian_docs and 16 more Debian documentation
# packages, whole (~77 MB of text; conf/data/debian_docs_large.yaml). Prepared with the
# 1,024-entry BPE by document into ~31.0M train, ~1.36M validation and ~1.36M test tokens,
# so the tiny study's 10,000 steps (10.2M tokens) read a third of an epoch. Needs apt-get,
# dpkg-deb and a Debian mirror for the build (~2 min), then ~1 min to prepare.
LARGE_CORPUS := data/debian_docs_large__bytebpe1k
.PHONY: corpus-large
corpus-large: $(STAMP)
	@test -f $(LARGE_CORPUS)/metadata.json || $(PY) -m pipelines.prepare data=debian_docs_large tokenizer=bytebpe1k

# What ships, and the early-gap candidates (issue 52), on that corpus: dense AdamS and AdamW
# with closed lr grids, each SCAPE arm at its multiplier x dense AdamS's chosen lr, 3 seeds,
# lr chosen on validation and every gap read on test (pipelines/studies/early_gap.py).
# EARLY_STEPS=400 is ~75 runs of ~75 s on 2 cores (~50 min); resumes. Writes results/early_gap/.
# EARLY_STEPS=10000 ARGS="--seeds <s> --models <model> --arms scape90 scape99" is one seed of
# one model at the verdict's longest horizon (dense grids, then the shipped arms: ~8 runs of
# ~8 min); a killed run resumes from its 5-minute checkpoint. Commit a seed only when all its
# runs are in: a grid with some of a seed's lrs reads as open (protocol.choose_lr).
# ARGS=--jobs N caps the study processes at a time (default: every core; dense AdamW's grid
# and each SCAPE arm run beside dense AdamS's grid, the arms once it has closed).
# ARGS=--rerun makes the shortest horizon's seed-0 dense and shipped runs again (the noise
# floor: results/early_gap/reruns/<host class>/, one folder per CPU class, so each new class
# adds to the floor); ARGS="--arms scape90 scape99": the shipped arms only.
EARLY_STEPS ?= 400
.PHONY: early-gap early-gap-report
early-gap: corpus-large
	$(PY) -m pipelines.studies.early_gap --steps $(EARLY_STEPS) $(ARGS)
early-gap-report: $(STAMP)
	$(PY) -m pipelines.studies.run_store results/early_gap/runs
	@for d in results/early_gap/reruns/*/runs; do test ! -d $$d || $(PY) -m pipelines.studies.run_store $$d; done
	$(PY) -m pipelines.studies.early_gap --report-only

# The GPU queue's corpus (scripts/gpu_quality.sh): English documentation from Debian's package
# registry, large enough that its longest run stays under one epoch; carry
# data/debian_docs__bytebpe1k with the tree (data_prep/docs_corpus.py).
gpu-corpus: $(STAMP)
	@test -f data/raw/debian_docs.jsonl.gz || $(PY) -m data_prep.docs_corpus --out data/raw/debian_docs.jsonl.gz
	$(PY) -m pipelines.prepare data=debian_docs tokenizer=bytebpe1k

gpu-wheels:
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
		--platform manylinux_2_28_$(ARCH) -r requirements/mcore-latest.txt -d vendor/wheels
	# the quality study's configuration (scripts/gpu_quality.sh): pure-Python wheels, antlr's
	# built here from its sdist; PyYAML's compiled one for the device's Python
	$(PYTHON) -m pip wheel --quiet --no-deps -w vendor/wheels \
		$$(grep -iE '^(hydra-core|omegaconf|antlr4-python3-runtime)==' requirements/cpu-lock.txt)
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--platform manylinux_2_17_$(ARCH) --platform manylinux2014_$(ARCH) -d vendor/wheels \
		$$(grep -iE '^pyyaml==' requirements/cpu-lock.txt)

clean-venv:
	rm -rf $(VENV) $(MCORE_VENV)

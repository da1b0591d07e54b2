# Two commands on a fresh machine: `make demo` runs the tour, `make test` runs the tests.
# Each creates .venv when missing and installs what it needs. A machine with an NVIDIA GPU
# gets CUDA 13 builds of PyTorch and JAX and onnxruntime-gpu (TensorFlow's CPU build); any
# other machine gets CPU builds. The choice lives in constraints/<platform>.txt and the lines
# below, never in pyproject.toml.

PYTHON   ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
HAS_GPU  := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
PLATFORM := $(if $(HAS_GPU),gpu,cpu)
STAMP    := $(VENV)/.installed-$(PLATFORM)
EXTRAS   := torch,jax,onnx,export,serve,nvml,plot,log,data,test,docs

# TensorFlow's CPU and CUDA builds are different packages, as are JAX's CUDA plugins. A GPU machine
# gets one CUDA major, 13 (constraints/gpu.txt; driver 580 or later): TensorFlow's CUDA build
# (tensorflow[and-cuda] 2.21) is CUDA 12 only, so TensorFlow runs on the CPU there too
# (tests/test_deploy_gpu.py checks these lines against constraints/gpu.txt).
FRAMEWORKS_cpu := tensorflow-cpu
FRAMEWORKS_gpu := tensorflow-cpu jax[cuda13]

export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: demo test test-models test-gpu lint docs install clean peers

demo: $(STAMP)
	$(BIN)/python examples/device_tour.py
	$(BIN)/python examples/first_contact.py
	$(BIN)/python examples/train_anywhere.py
	$(BIN)/python examples/train_recipe.py --backend jax
	$(BIN)/python examples/serve_end_to_end.py

# Two workers (pytest-xdist), each taking whole files: 13.5 min here instead of 20 in one.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

# The longer sets behind the realworld marker: the whole real-model suite (tests/realworld:
# transformers, keras.applications, Flax, equinox), the rest of the conversion matrix and JAX's
# run of the ONNX conformance list; `make test` runs their smoke cases only. Also the checks of
# the example scripts `make demo` runs (tests/training/test_example.py, tests/serving/test_example.py).
# Ray Train (the deploy/training/ray_train.py test) is installed for this set only, and the
# serving peers (the KServe client test).
test-models: $(STAMP) $(VENV)/.installed-ray peers
	$(BIN)/python -m pytest -m realworld --durations=25

$(VENV)/.installed-ray: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints/$(PLATFORM).txt -e '.[ray]'
	touch $@

# The serving peers benchmarks/peers.py measures (MLServer, KServe), each in its own virtualenv
# under .peers/ (never in .venv), with the ONNX Runtime xdevice runs.
PEERS := .peers
peers: $(PEERS)/mlserver/.installed $(PEERS)/kserve/.installed

$(PEERS)/%/.installed:
	test -x $(PEERS)/$*/bin/python || $(PYTHON) -m venv $(PEERS)/$*
	$(PEERS)/$*/bin/python -m pip install -q $(PEER_$*) onnxruntime==1.31.1
	touch $@

PEER_mlserver := mlserver==1.7.1
PEER_kserve   := kserve==0.21.0

# On a GPU machine with this repository installed in its own Python (the lent GPU box has
# no registry access), run `make test-gpu VENV_PYTHON=python3`.
VENV_PYTHON ?= $(BIN)/python
test-gpu:
	@if [ "$(VENV_PYTHON)" = "$(BIN)/python" ]; then $(MAKE) --no-print-directory $(STAMP); \
	else $(VENV_PYTHON) -m pip install -q --no-build-isolation --no-deps -e .; fi
	$(VENV_PYTHON) -m pytest -m gpu --xdevice-devices=auto -p no:cacheprovider

# The promises the tools keep (make test runs this first): ruff's lint and format, the layer
# contracts (import-linter; xdevice/backends and xdevice/converters are links to the top-level
# folders, so grimp sees the package as installed), and the type checker (pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	@! grep -rnE --include='*.py' '# (noqa(: [A-Z0-9, ]+)?|type: ignore(\[[a-z, -]+\])?)\s*$$' xdevice backends converters tests examples benchmarks docs || { echo 'a # noqa or # type: ignore needs its reason after it'; exit 1; }
	$(BIN)/python -m pytest --doctest-modules xdevice -q -p no:cacheprovider

# The documentation site (mkdocs.yml), built into site/; a warning fails it.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

install: $(STAMP)

$(STAMP): pyproject.toml constraints/$(PLATFORM).txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints/$(PLATFORM).txt -e '.[$(EXTRAS)]' $(FRAMEWORKS_$(PLATFORM))
ifeq ($(PLATFORM),gpu)
	# Something may have pulled the CPU onnxruntime over onnxruntime-gpu: leave the GPU one alone.
	$(BIN)/python -m pip uninstall -q -y onnxruntime onnxruntime-gpu
	$(BIN)/python -m pip install -q -c constraints/gpu.txt --no-deps onnxruntime-gpu
endif
	# keras-hub without its tensorflow-text requirement: that pulls the full tensorflow package
	# over tensorflow-cpu, and only keras-hub's tokenizers use it (the real-model suite builds a
	# backbone from a config).
	$(BIN)/python -m pip install -q -c constraints/$(PLATFORM).txt --no-deps keras-hub
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

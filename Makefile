# Quick start: `make run` brings the whole system up; `make test` runs the suite.
# Both set up everything they need on a fresh machine: venv, packages, database, broker.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# The suite runs in TEST_WORKERS processes (pytest-xdist), one test file to each at a
# time: its live tests mostly wait on processes they started, so two share two cores.
TEST_WORKERS ?= 2
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test test-fast lint bench chaos venv clean browser faketime

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found " + sys.version.split()[0]'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	@# The package by its import name, dynamic_batching, as a host installs it (pyproject.toml).
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

run: venv
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/run.py

# The browser test drives Debian's chromium (never a downloaded browser). Installed when
# missing, as root (CI); elsewhere the test skips and says why.
browser:
	@command -v chromium >/dev/null || [ -x /usr/bin/chromium ] || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "could not install chromium: the browser test will skip"

# tests/live/test_clocks.py shifts a web process's clock with Debian's libfaketime (any
# architecture's path); without it those tests skip and say why.
faketime:
	@ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || (apt-get install -y faketime >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y faketime >/dev/null)) || true

# pytest exits 5 when it collects no test: that is a broken suite, not a pass.
test: venv browser faketime
	@# tests/unit/site/test_deploy.py validates docker-compose.yml with Debian's docker-compose (no engine needed).
	@command -v docker-compose >/dev/null || (apt-get install -y docker-compose >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y docker-compose >/dev/null)) || true
	@# tests/live/test_redis_tls.py runs Debian's redis-server with TLS, certificates from openssl.
	@(command -v redis-server && command -v openssl) >/dev/null || (apt-get install -y redis-server openssl >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y redis-server openssl >/dev/null)) || true
	@# tests/live/test_tls_proxy.py puts Debian's caddy in front of the web process and Flower.
	@command -v caddy >/dev/null || (apt-get install -y caddy >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y caddy >/dev/null)) || true
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

test-fast: venv
	$(BIN)/python -m pytest -m "not live" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# The emulated-accelerator sections of docs/benchmarks.md: a device slow enough that
# two cores can feed it (against plain Celery and celery-batches; serial against
# overlap), and a faster one, where the serving path's CPU is the limit (overlap only).
# 600 texts a load keep `make bench` from a fresh clone under 15 minutes on a slow
# 2-core machine (1,000 took it to 15 min 48 s on 2026-12-08's AMD EPYC).
ACCELERATOR = --texts 600 --callers 1 16 64

bench: venv
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -r requirements-bench.txt
	HF_HUB_OFFLINE=1 $(BIN)/python bench/run_all.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/accelerator.py $(ACCELERATOR) --overhead-ms 50 --per-token-us 150 --write docs/benchmarks.md --part device-bound
	HF_HUB_OFFLINE=1 $(BIN)/python bench/accelerator.py $(ACCELERATOR) --overhead-ms 10 --per-token-us 100 --no-baselines --variants overlap --write docs/benchmarks.md --part cpu-bound

clean:
	rm -rf $(VENV) .run db.sqlite3

# The crash, hang, takeover and clock tests, five times in a row.
chaos: venv faketime
	for i in 1 2 3 4 5; do HF_HUB_OFFLINE=1 $(BIN)/python -m pytest tests/live/test_chaos.py tests/live/test_clocks.py -q -p no:randomly || exit 1; done

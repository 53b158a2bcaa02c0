# The development loop; docs/code-map.md explains it. A newcomer needs only the README's
# two commands (scripts/demo.sh, scripts/test.sh), which set everything up first.
# These targets expect that set-up done (.venv, promtool, prometheus: scripts/setup.sh).

PY := .venv/bin/python
PYTEST := $(PY) -m pytest -p no:cacheprovider

.PHONY: help generate lint test test-e2e

help:
	@echo "make generate   rewrite every generated file from its source"
	@echo "make lint       ruff check, ruff format --check, mypy (strict)"
	@echo "make test       unit tests: no vLLM, no docker, no Prometheus, nothing slow (about 2 min)"
	@echo "make test-e2e   every test, end-to-end ones on real vLLM and Prometheus included"

# Dashboards from their Python sources, the example SLO file's rules, then the chart's and
# the mixin's copies of dashboards and rules, then docs/exporter.md's table of windowed
# series (from core/series.py).
generate:
	.venv/bin/glassbox dashboards generate
	.venv/bin/glassbox rules --slo alerts/slo/example.yaml --out alerts/slo/ 2>/dev/null
	$(PY) scripts/sync-chart-files.py
	$(PY) scripts/sync-mixin.py
	$(PYTEST) -q tests/exporter/test_cli.py -k docs_table --update-golden

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	scripts/check-types.sh

test:
	$(PYTEST) -q -m "not vllm and not docker and not prometheus and not slow"

test-e2e:
	$(PYTEST)

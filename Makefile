# The two commands a new machine needs: `make quickstart` and `make test`.
PY := .venv/bin/python
export RAY_AUTH_MODE ?= disabled

.PHONY: setup quickstart test test-fast lint

setup:
	@bash scripts/setup.sh

quickstart: setup
	@bash scripts/quickstart.sh

test: setup
	@bash scripts/test.sh

# the default suite without the end-to-end tests marked slow (learning runs, vLLM, cluster flows)
test-fast: setup
	@RLKIT_TEST_MARK="not slow" bash scripts/test.sh

lint: setup
	@.venv/bin/ruff check .

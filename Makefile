# The README's two commands.  Both create .venv and install what they need.
.PHONY: run test lint

# Train the default bot long enough to show learning, then write a checkpoint.
run:
	./tools/setup.sh
	.venv/bin/sacbot run --steps 10000 --pace lockstep

# Lint, then the whole test suite, one pytest-xdist worker per core: the suite is mostly
# single-threaded, so on CI's 2 cores this halves it.  --dist loadgroup keeps the Ray tests on
# one worker (tests/test_cluster.py says why).
test:
	./tools/setup.sh test
	.venv/bin/ruff check sacbot envs tools tests
	.venv/bin/pytest -q -n auto --dist loadgroup

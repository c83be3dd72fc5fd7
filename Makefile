# The README's two commands.  Both create .venv and install what they need.
.PHONY: run test lint

# Train the default bot long enough to show learning, then write a checkpoint.
run:
	./tools/setup.sh
	.venv/bin/sacbot run --steps 10000 --pace lockstep

# Lint, then the whole test suite.
test:
	./tools/setup.sh test
	.venv/bin/ruff check sacbot envs tools tests
	.venv/bin/pytest -q

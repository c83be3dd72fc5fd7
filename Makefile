# The README's two commands.  Both create .venv and install what they need.
.PHONY: run test lint

# Train the default bot long enough to show learning, then write a checkpoint.
run:
	./tools/setup.sh train
	.venv/bin/sacbot run --steps 10000 --pace lockstep

# Lint, then the whole test suite, one pytest-xdist worker per core: the suite is mostly
# single-threaded, so on CI's 2 cores this halves it.  nproc, not xdist's "auto", because nproc
# honours the CPUs this process may use (auto may count the host's); at most 4 workers, because each
# imports torch.  `make test JOBS=1` runs it on one.  Worksteal: an idle worker takes tests queued
# for a busy one, so the slow tests at the end are shared out.  The tests marked alone run after, one at a time:
# latency bounds, Robocode's battles (a robot starved for 30 turns is stopped) and the Ray clusters (a
# starved GCS makes Ray's driver give up).  Setup installs the JDK, msgpack-java and Robocode
# from the OS packages where they are missing, so the Java client's and Robocode's tests run.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)
test:
	./tools/setup.sh test,java,robocode
	.venv/bin/ruff check sacbot envs tools tests
	.venv/bin/lint-imports
	.venv/bin/pytest -q -n $(JOBS) --dist worksteal -m "not alone"
	.venv/bin/pytest -q -p no:xdist -m alone

"""What training needs in memory, checked at start, before anything is allocated.

    check_memory(cfg, obs_dim, act_dim)   # ConfigError when these settings cannot fit this machine

Each setting has its own ceiling (``sacbot.config``), but some combinations of settings within
them cannot fit any machine sacbot runs on: ``--buffer-size 10000000`` of a 100,000-value
observation is 8 TB of replay, and ``--batch-size 4096 --seq-len 1024 --hidden 1024`` needs
terabytes for one gradient step.  Unchecked, the first fails in the learner's first allocation
(or later, in the kernel's OOM killer, once the lazily allocated replay fills up) and the second
in its first update.  The estimates here are lower bounds, so a refusal is certain, never a guess.
"""

from __future__ import annotations

import os

from sacbot.config import Config, ConfigError

# Floats one update keeps per sampled step, per sequence, per hidden unit: the activations of the
# actor's and the critic's fc1 and LSTM (gates, states) for the backward pass, and the target's.
# Measured: ~34 (peak RSS growth of one update at B 64, L 64, h 512 and at B 128, L 128, h 256,
# CPU, quantization off).  Half of it is the floor the check uses.
UPDATE_FLOATS_PER_UNIT = 16


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 1e3:,.1f} kB"


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the machine's, or its control group's limit if lower
    (a container).  None where neither can be read."""
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit
            total = int(text) if total is None else min(total, int(text))
    return total if total and total > 0 else None


def device_memory(device: str) -> int | None:
    """Bytes of memory of the learner's GPU, or None (the CPU, or a device that cannot be asked)."""
    if device == "cpu":
        return None
    try:
        import torch

        from sacbot.learning.sac import resolve_device

        dev = resolve_device(device)
        if dev.type != "cuda":
            return None
        return int(torch.cuda.get_device_properties(dev).total_memory)
    except Exception:  # noqa: BLE001 - a missing GPU is check_settings' to report, with its own message
        return None


def _windows(cfg: Config) -> tuple[int, int]:
    """(sequences, steps per sequence) of one update, the sampled next step included
    (sacbot.learning.training._windows: the memoryless control takes batch_size * seq_len steps alone)."""
    if cfg.memoryless:
        return cfg.batch_size * cfg.seq_len, 2
    return cfg.batch_size, cfg.burn_in + cfg.seq_len + 1


def replay_bytes(cfg: Config, obs_dim: int, act_dim: int) -> int:
    from sacbot.store.format import replay_row_bytes  # the replay's own arrays, row by row

    return (cfg.buffer_size + 1) * replay_row_bytes(obs_dim, act_dim)


def update_bytes(cfg: Config, obs_dim: int, act_dim: int) -> int:
    """A floor of what one gradient step holds at its peak: the activations, and the sampled batch
    (as numpy, then as tensors)."""
    seqs, steps = _windows(cfg)
    return 4 * seqs * steps * (UPDATE_FLOATS_PER_UNIT * cfg.hidden + 2 * (obs_dim + act_dim))


def check_memory(cfg: Config, obs_dim: int, act_dim: int, available: int | None = None,
                 on_device: int | None = None) -> None:
    """ConfigError when the replay and one update cannot fit in this machine's memory (or the
    update in the GPU's).  ``available`` and ``on_device`` default to what this machine has."""
    available = machine_memory() if available is None else available
    on_device = device_memory(cfg.device) if on_device is None else on_device
    replay, update = replay_bytes(cfg, obs_dim, act_dim), update_bytes(cfg, obs_dim, act_dim)
    seqs, steps = _windows(cfg)
    step_what = (f"one gradient step (batch_size = {cfg.batch_size}"
                 + (f" x seq_len = {cfg.seq_len} one-step sequences (memoryless)" if cfg.memoryless else
                    f" sequences of burn_in + seq_len + 1 = {steps} steps") + f", hidden = {cfg.hidden})")
    row = replay // (cfg.buffer_size + 1)
    replay_what = (f"the replay (buffer_size = {cfg.buffer_size:,} rows of {row:,} bytes for a {obs_dim}-value "
                   f"observation)")
    if on_device is not None and update > on_device:
        raise ConfigError(f"{step_what} needs at least {_bytes(update)} on the GPU, more than the "
                          f"{_bytes(on_device)} of {cfg.device}: lower --batch-size, --seq-len, --burn-in or --hidden")
    need = replay + (update if on_device is None else 0)
    if available is None or need <= available:
        return
    if on_device is not None or replay >= update:
        fits = max(0, available - (0 if on_device is not None else update)) // row - 1
        accepted = (f"buffer_size = {fits:,} at most fits beside it" if fits >= 1 else
                    "no replay fits beside it")
        raise ConfigError(f"{replay_what} needs {_bytes(replay)}"
                          + ("" if on_device is not None else f", and {step_what} at least {_bytes(update)}")
                          + f": more than the {_bytes(available)} of memory this machine has ({accepted}); "
                          "lower --buffer-size")
    per_batch = update // cfg.batch_size  # one sequence (memoryless: seq_len one-step ones)
    fits = max(0, available - replay) // per_batch
    accepted = (f"batch_size = {fits:,} at most fits at these other settings" if fits >= 1 else
                "no batch fits at these other settings")
    raise ConfigError(f"{step_what} needs at least {_bytes(update)} of memory, and {replay_what} {_bytes(replay)}: "
                      f"more than the {_bytes(available)} this machine has ({accepted}); lower --batch-size, "
                      "--seq-len, --burn-in or --hidden")

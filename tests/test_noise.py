"""Coloured exploration noise (sacbot/acting/noise.py) and the Agent acting on it (noise_color)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import OBS_SPACE, small_cfg

from sacbot import Agent
from sacbot.acting.noise import ColoredNoise

pytestmark = pytest.mark.timeout(60)


def chunks(beta, n=400, dim=2, chunk=512, seed=0):
    noise = ColoredNoise(beta, dim, np.random.default_rng(seed), chunk=chunk)
    return np.stack([noise._make() for _ in range(n)])  # (n, chunk, dim)


def lag1(x):
    """Mean correlation of neighbouring draws along time."""
    return float((x[:, 1:] * x[:, :-1]).mean())


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("chunk", [512, 301])
def test_every_draw_is_a_unit_gaussian_whatever_the_colour(beta, chunk):
    x = chunks(beta, chunk=chunk)
    per_tick = x.var(axis=(0, 2))  # 800 draws at each place in the chunk
    assert abs(x.mean()) < 0.1
    assert 0.8 < per_tick.min() and per_tick.max() < 1.2, (per_tick.min(), per_tick.max())
    assert abs(x.var() - 1) < 0.05


@pytest.mark.parametrize("beta", [0.0, 1.0, 2.0])
def test_the_spectrum_falls_as_one_over_f_to_the_beta(beta):
    x = chunks(beta, n=200, chunk=1024)
    power = (np.abs(np.fft.rfft(x, axis=1)) ** 2).mean(axis=(0, 2))
    f = np.fft.rfftfreq(1024)
    band = (f > 0.01) & (f < 0.4)
    slope = np.polyfit(np.log(f[band]), np.log(power[band]), 1)[0]
    assert slope == pytest.approx(-beta, abs=0.1)


def test_white_draws_are_independent_and_pink_ones_are_not():
    assert abs(lag1(chunks(0.0))) < 0.02
    assert lag1(chunks(1.0)) > 0.5
    assert lag1(chunks(2.0)) > lag1(chunks(1.0))


def test_a_seed_repeats_the_draws_and_a_restart_starts_a_new_sequence():
    a, b = (ColoredNoise(1.0, 3, np.random.default_rng(5), chunk=8) for _ in range(2))
    first = [a.standard_normal(3).copy() for _ in range(20)]  # crosses two chunk ends
    assert all(np.array_equal(x, b.standard_normal(3)) for x in first)
    assert np.array_equal(a.last, first[-1])
    a.restart()
    assert not np.array_equal(a.standard_normal(3), b.standard_normal(3))  # b is mid-chunk, a is not


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="beta = -1"):
        ColoredNoise(-1, 2, np.random.default_rng(0))
    noise = ColoredNoise(1, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="size = 3: this noise draws 2 values per tick"):
        noise.standard_normal(3)


def warmup_actions(tmp_path, n=300, **kw):
    """Actions of a bot still in its warm-up (learning_starts not reached): exploration only."""
    import gymnasium as gym

    cfg = small_cfg(tmp_path, learning_starts=10_000, buffer_size=10_000, learner="thread", **kw)
    with Agent(cfg, OBS_SPACE, gym.spaces.Box(-1, 1, (2,), np.float32)) as agent:
        agent.new_episode("x")
        acts = []
        for _ in range(n):
            acts.append(agent.act(np.zeros(3)))
            agent.observe(0.0, np.zeros(3), False, False)
    return np.array(acts)


def test_the_warm_up_explores_on_the_coloured_draws_and_stays_uniform_by_default(tmp_path):
    white = warmup_actions(tmp_path / "w")
    pink = warmup_actions(tmp_path / "p", noise_color=1.0)
    # Uniform on [-1, 1]: variance 1/3, neighbours unrelated. Pink: tanh of draws that drift together.
    assert abs(white.var() - 1 / 3) < 0.05 and abs(np.corrcoef(white[1:, 0], white[:-1, 0])[0, 1]) < 0.2
    assert np.corrcoef(pink[1:, 0], pink[:-1, 0])[0, 1] > 0.5
    assert np.abs(pink).max() < 1.0  # inside the box: tanh, not clipping

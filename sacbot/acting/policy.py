"""The acting policy: a pure numpy function of (params, obs, state).  No torch here.

Usage::

    params = build_params(learner.export_actor())    # or a snapshot's arrays
    state = initial_state(params)                    # at every episode start
    for tick in game:
        action, state = act(params, obs, state)      # deterministic: tanh(mean)
        action, state = act(params, obs, state, rng) # stochastic, for exploration (a numpy
                                                     # Generator, or noise.ColoredNoise)

It computes what the learner's fake-quant actor computes (sacbot/learning/quant.py): quantized
linear layers multiply integer-valued float32 arrays, which is exact, then apply
``s_x * s_w``; the LSTM sees the dequantized input and weights and keeps an fp32 state.  Its
cell is computed in float64 and rounded to float32 once: float32 sums in another order (another
BLAS, an ONNX runtime) would round differently, and one ulp in ``h`` can move the next layer's
quantized input a whole step; in float64 every faithful implementation rounds to the same
state (``sacbot export``'s ONNX actor matches this policy to 1e-7 over whole episodes).
Acting runs in numpy because torch on the acting thread, next to a training thread, showed
p99 ~9 ms per call; numpy stays near 0.1 ms.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from sacbot.wire.snapshot import LOG_STD_MAX, LOG_STD_MIN


class Linear(NamedTuple):
    """One linear layer ready to run: weights, bias and, when quantized, its input's scale and
    integer range and the per-output rescale ``s_x * s_w``."""

    w: np.ndarray  # (out, in) float32; integer-valued when quantized
    b: np.ndarray  # (out,)
    x_scale: np.float32 | None  # None: fp32 layer
    x_lo: float
    x_hi: float
    out_scale: np.ndarray | None  # s_x * s_w per output channel


class LSTMCell(NamedTuple):
    """The LSTM cell's dequantized weights (float64) and its input's quantization, if any."""

    w_ih: np.ndarray  # (4H, in) dequantized, float64 (the cell is computed in float64)
    w_hh: np.ndarray  # (4H, H) float64
    b_ih: np.ndarray  # float64
    b_hh: np.ndarray
    x_scale: np.float32 | None
    x_lo: float
    x_hi: float


class ActorParams(NamedTuple):
    """Everything one actor step needs, built once per published version by ``build_params``."""

    obs_dim: int  # the observation's size; the actor reads its first n_obs values
    act_dim: int
    hidden: int
    fc1: Linear
    lstm: LSTMCell
    fc2: Linear
    head: Linear
    n_obs: int  # obs_dim less the values only the critic reads (Config.critic_obs)


class PolicyState(NamedTuple):
    """What the actor carries from tick to tick: the LSTM's ``h`` and ``c``, and the previous action."""

    h: np.ndarray
    c: np.ndarray
    prev_act: np.ndarray


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _input_quant(arrays, name):
    if f"{name}.x_scale" not in arrays:
        return None, 0.0, 0.0
    lo, hi = (float(v) for v in arrays[f"{name}.x_range"])
    return np.float32(arrays[f"{name}.x_scale"]), lo, hi


def _linear(arrays, name) -> Linear:
    sx, lo, hi = _input_quant(arrays, name)
    w = _f32(arrays[f"{name}.w"])
    out_scale = None if sx is None else (sx * _f32(arrays[f"{name}.w_scale"])).astype(np.float32)
    return Linear(w, _f32(arrays[f"{name}.b"]), sx, lo, hi, out_scale)


def _dequant(arrays, key):
    w = _f32(arrays[key])
    if f"{key}_scale" in arrays:
        w = (w * _f32(arrays[f"{key}_scale"])[:, None]).astype(np.float32)
    return w


def build_params(arrays: dict[str, np.ndarray]) -> ActorParams:
    """Turn an exported actor (int8 weights + scales, or fp32) into ready-to-run arrays.
    Done once per published version, outside the snapshot lock."""
    obs_dim, act_dim, hidden, _ = (int(v) for v in arrays["meta.sizes"])
    sx, lo, hi = _input_quant(arrays, "lstm")
    lstm = LSTMCell(*(a.astype(np.float64) for a in (_dequant(arrays, "lstm.w_ih"), _dequant(arrays, "lstm.w_hh"),
                                                     _f32(arrays["lstm.b_ih"]), _f32(arrays["lstm.b_hh"]))),
                    sx, lo, hi)
    fc1 = _linear(arrays, "fc1")
    n_obs = fc1.w.shape[1] - act_dim  # fc1 reads [the actor's observation, the previous action]
    if not 0 < n_obs <= obs_dim:
        raise ValueError(f"actor export: fc1 reads {n_obs} observation values, the observation has {obs_dim}")
    return ActorParams(obs_dim, act_dim, hidden, fc1, lstm, _linear(arrays, "fc2"), _linear(arrays, "head"), n_obs)


def initial_state(params: ActorParams) -> PolicyState:
    """The state at an episode's start: zeros."""
    z = np.zeros(params.hidden, np.float32)
    return PolicyState(z, z.copy(), np.zeros(params.act_dim, np.float32))


def _apply(layer: Linear, x: np.ndarray) -> np.ndarray:
    if layer.x_scale is None:
        return layer.w @ x + layer.b
    # minimum/maximum, not np.clip: the same values, at a fraction of clip's call overhead on short vectors
    q = np.rint(np.minimum(np.maximum(x / layer.x_scale, layer.x_lo), layer.x_hi))
    return (layer.w @ q) * layer.out_scale + layer.b


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def mean_and_log_std(params: ActorParams, obs: np.ndarray, state: PolicyState):
    """One actor step: (mean, log_std, h, c)."""
    x = np.concatenate([obs[: params.n_obs], state.prev_act]).astype(np.float32, copy=False)
    z = np.maximum(_apply(params.fc1, x), 0.0)
    cell = params.lstm
    if cell.x_scale is not None:
        z = np.rint(np.minimum(np.maximum(z / cell.x_scale, cell.x_lo), cell.x_hi)) * cell.x_scale
    gates = (cell.w_ih @ z.astype(np.float64) + cell.b_ih) + (cell.w_hh @ state.h.astype(np.float64) + cell.b_hh)
    n = params.hidden
    s = _sigmoid(gates)  # one call for the three gates that need it (g's sigmoid is unused)
    i, f, o = s[:n], s[n:2 * n], s[3 * n:]
    c64 = f * state.c + i * np.tanh(gates[2 * n:3 * n])
    h = (o * np.tanh(c64)).astype(np.float32)
    c = c64.astype(np.float32)
    y = np.maximum(_apply(params.fc2, h), 0.0)
    out = _apply(params.head, y)
    mu, raw = out[: params.act_dim], out[params.act_dim:]
    log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (np.tanh(raw) + 1.0)
    return mu, log_std, h, c


class Noise(Protocol):
    """Where exploration draws come from: a ``numpy.random.Generator`` (white) or a ColoredNoise."""

    def standard_normal(self, size: int) -> np.ndarray: ...


def act(params: ActorParams, obs: np.ndarray, state: PolicyState,
        rng: Noise | None = None) -> tuple[np.ndarray, PolicyState]:
    """(action in [-1, 1]^A, next state).  With no rng: tanh of the mean; with one, tanh of the mean
    plus the standard deviation times ``rng.standard_normal(act_dim)``."""
    mu, log_std, h, c = mean_and_log_std(params, obs, state)
    u = mu if rng is None else mu + np.exp(log_std) * rng.standard_normal(params.act_dim).astype(np.float32)
    action = np.tanh(u).astype(np.float32)
    return action, PolicyState(h, c, action)

"""Learner: QAT invariants, numpy parity, exact state round trip, SAC maths,
and a memory task that only a recurrent learner can solve."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sacbot.acting import policy
from sacbot.config import Config
from sacbot.envs.memory import CueMemory
from sacbot.learning.quant import QLSTM, QUANTIZING, QLinear
from sacbot.learning.replay import SequenceReplay
from sacbot.learning.sac import SACLSTMLearner, n_step_targets, tanh_log_prob

torch.set_num_threads(1)
OBS, ACT = 35, 4


def filled_replay(n=600, seed=0, obs_dim=OBS, act_dim=ACT, ep_len=50):
    rng = np.random.default_rng(seed)
    buf = SequenceReplay(2000, obs_dim, act_dim)
    for i in range(n):
        buf.add(rng.standard_normal(obs_dim), rng.uniform(-1, 1, act_dim), rng.standard_normal(),
                rng.standard_normal(obs_dim), False, i % ep_len == ep_len - 1)
    return buf


def trained_learner(quant="on", bits=8, updates=12, seed=0, hidden=64):
    # init_alpha 0.02: the parity test below is exact up to float rounding except where an input
    # lands within ~1e-6 of a rounding edge, which then moves one integer step (~1e-4 at the
    # action).  These weights have no such input; init_alpha 1.0 gives one at 8 bits (measured
    # 1.2e-4).  docs/design.md ("Quantization-aware training") says why such edges exist.
    cfg = Config(quant=quant, quant_bits=bits, calib_updates=4, hidden=hidden, seed=seed, init_alpha=0.02)
    learner = SACLSTMLearner(OBS, ACT, cfg)
    buf, rng = filled_replay(seed=seed), np.random.default_rng(seed)
    for _ in range(updates):
        learner.update(buf.sample(16, 32, rng))
    return learner, buf, rng


def quant_layers(learner):
    return [m for m in learner.actor.modules() if isinstance(m, QLinear | QLSTM)]


def test_ste_gradients_reach_weights_and_scales():
    learner, _, _ = trained_learner()
    assert learner.quant_phase == "training"
    layers = quant_layers(learner)
    assert len(layers) == 4 and all(int(m.phase) == QUANTIZING for m in layers)
    learner.actor.zero_grad()
    obs = torch.randn(10, 4, OBS) * 2  # (T, B, .)
    mu, log_std, _ = learner.actor(obs, torch.rand(10, 4, ACT) * 2 - 1)
    (mu.pow(2).sum() + log_std.sum()).backward()
    for m in layers:
        weights = [m.weight] if isinstance(m, QLinear) else [m.weight_ih, m.weight_hh]
        scales = [q.log_scale for q in m.modules() if hasattr(q, "log_scale")]
        assert len(scales) == (2 if isinstance(m, QLinear) else 3)
        for p in weights + scales:
            assert p.grad is not None, f"no gradient reached {type(m).__name__}"
            assert torch.isfinite(p.grad).all()
            assert p.grad.abs().sum() > 0, f"zero gradient in {type(m).__name__} {tuple(p.shape)}"


def test_scales_stay_positive_when_pushed_to_zero():
    learner, _, _ = trained_learner(updates=5)
    quantizers = [q for q in learner.actor.modules() if hasattr(q, "log_scale")]
    params = [q.log_scale for q in quantizers]
    opt = torch.optim.Adam(params, lr=0.5)  # aggressive: a few hundred steps reach the floor
    x = torch.randn(8, OBS + ACT)
    for step in range(2000):
        opt.zero_grad()
        # d/ds of sum(s) > 0: every step pushes every scale toward zero.
        loss = sum(q.scale().sum() for q in quantizers) + learner.actor.fc1(x).sum() * 0
        loss.backward()
        opt.step()
        for q in quantizers:
            s = q.scale()
            assert torch.isfinite(s).all() and (s > 0).all(), f"scale not positive at step {step}"
    assert min(float(q.scale().detach().min()) for q in quantizers) < 1e-6  # really pushed down


@pytest.mark.parametrize("bits", [8, 3])
def test_fused_quant_backward_matches_autograd_reference(bits):
    """The layers' hand-written backward (one autograd node per layer, for speed) must give
    the gradients autograd derives from the quantizers' composable pieces."""
    torch.manual_seed(0)
    lin = QLinear(39, 64, quant=True, bits=bits, input_signed=True)
    lstm = QLSTM(64, 64, quant=True, bits=bits, input_signed=False)
    x, z = torch.randn(33, 16, 39), torch.randn(33, 16, 64).relu()
    for layer, inp in ((lin, x), (lstm, z)):
        layer(inp)
        layer.finish_calibration()
        with torch.no_grad():  # smaller scales than calibration's, so some values clip
            for q in layer.modules():
                if hasattr(q, "log_scale"):
                    q.log_scale.sub_(0.7)

    def reference_linear(x):
        sx, sw = lin.xq.scale(), lin.wq.scale()
        return F.linear(lin.xq.integer(x, sx) * sx, lin.wq.integer(lin.weight, sw) * sw) + lin.bias

    def reference_lstm_inputs(z):
        return [q.integer(t, q.scale()) * q.scale()
                for q, t in ((lstm.xq, z), (lstm.wq_ih, lstm.weight_ih), (lstm.wq_hh, lstm.weight_hh))]

    def grads(f, inp, params):
        inp = inp.clone().requires_grad_()
        outs = f(inp)
        outs = outs if isinstance(outs, tuple | list) else [outs]
        g = torch.Generator().manual_seed(1)
        sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs).backward()
        got = [inp.grad.clone()] + [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        return got

    lin_params = [lin.weight, lin.bias, lin.xq.log_scale, lin.wq.log_scale]
    lstm_params = [lstm.weight_ih, lstm.weight_hh, lstm.xq.log_scale, lstm.wq_ih.log_scale, lstm.wq_hh.log_scale]
    for fused, ref, inp, params in ((lin, reference_linear, x, lin_params),
                                    (lambda t: lstm.effective_weights(t), reference_lstm_inputs, z, lstm_params)):
        for got, want in zip(grads(fused, inp, params), grads(ref, inp, params), strict=True):
            assert want.abs().sum() > 0
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize("quant,bits", [("on", 8), ("on", 4), ("on", 3), ("off", 8)])
def test_numpy_policy_matches_fake_quant_actor(quant, bits):
    learner, _, _ = trained_learner(quant, bits)
    export = learner.export_actor()
    if quant == "on":
        assert export["fc1.w"].dtype == np.int8 and export["fc1.w_scale"].dtype == np.float32
        assert np.abs(export["fc1.w"]).max() <= 2 ** (bits - 1) - 1
    else:
        assert export["fc1.w"].dtype == np.float32 and "fc1.w_scale" not in export
    params = policy.build_params(export)
    rng = np.random.default_rng(1)
    obs = (rng.standard_normal((100, OBS)) * 1.5).astype(np.float32)
    for stochastic in (False, True):
        noise_rng = np.random.default_rng(7) if stochastic else None
        st, acts = policy.initial_state(params), []
        for t in range(100):
            a, st = policy.act(params, obs[t], st, noise_rng)
            acts.append(a)
        acts = np.array(acts)
        eps = np.random.default_rng(7).standard_normal((100, ACT)).astype(np.float32)
        with torch.no_grad():  # the actor is time-major: (T=100, B=1, .)
            prev = torch.cat([torch.zeros(1, 1, ACT), torch.as_tensor(acts)[:-1, None]], 0)
            mu, log_std, _ = learner.actor(torch.as_tensor(obs)[:, None], prev)
            u = mu + log_std.exp() * torch.as_tensor(eps)[:, None] if stochastic else mu
            ref = torch.tanh(u)[:, 0].numpy()
        diff = np.abs(ref - acts).max()
        assert diff <= 1e-5, f"{quant}/{bits} bits stochastic={stochastic}: max diff {diff}"


def test_state_round_trip_gives_bitwise_identical_next_update():
    a, buf, rng = trained_learner(updates=8)  # crosses the calibration boundary (4)
    arrays, meta = a.state()
    b = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=123))  # other seed: all from state
    b.load_state({k: v.copy() for k, v in arrays.items()}, meta)
    batch = buf.sample(16, 32, rng)
    ma, mb = a.update(batch), b.update(batch)
    assert ma == mb
    sa, _ = a.state()
    sb, _ = b.state()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert np.array_equal(sa[k], sb[k]), k
    # and the check can fail: one more update on a only
    a.update(batch)
    assert not np.array_equal(a.state()[0]["actor.fc1.weight"], sb["actor.fc1.weight"])


def test_same_seed_gives_bitwise_identical_updates():
    s1 = trained_learner(updates=6, seed=3)[0].state()[0]
    s2 = trained_learner(updates=6, seed=3)[0].state()[0]
    s3 = trained_learner(updates=6, seed=4)[0].state()[0]
    assert all(np.array_equal(s1[k], s2[k]) for k in s1)
    assert not np.array_equal(s1["critic.fc1.weight"], s3["critic.fc1.weight"])


def test_the_temperature_moves_toward_the_configured_entropy_target():
    # Same seed, same batches, two targets either side of the fresh policy's entropy: the
    # temperature must rise under the high one (explore more) and fall under the low one.
    alphas = {}
    for per_dim in (0.5, -10.0):
        cfg = Config(calib_updates=4, hidden=16, seed=0, target_entropy_per_dim=per_dim)
        learner = SACLSTMLearner(OBS, ACT, cfg)
        assert learner.target_entropy == per_dim * ACT
        buf, rng = filled_replay(), np.random.default_rng(0)
        for _ in range(5):
            out = learner.update(buf.sample(8, 8, rng))
        alphas[per_dim] = out["alpha"]
    assert alphas[0.5] > Config.init_alpha > alphas[-10.0], alphas


def test_tanh_log_prob_matches_numerical_density():
    mu, log_std = torch.tensor([0.3]), torch.tensor([math.log(0.8)])
    std = 0.8
    # density of a = tanh(u) by finite differences of its CDF: Phi((atanh(a) - mu) / std)
    from statistics import NormalDist
    for a in (-0.95, -0.5, 0.0, 0.4, 0.9):
        h = 1e-5
        cdf = lambda x: NormalDist(0.3, std).cdf(math.atanh(x))  # noqa: E731
        numeric = math.log((cdf(a + h) - cdf(a - h)) / (2 * h))
        u = torch.tensor([math.atanh(a)], dtype=torch.float32)
        ours = float(tanh_log_prob(u, mu, log_std))
        assert abs(ours - numeric) < 1e-3, (a, ours, numeric)


def _learner_whose_target_says_10(cfg: Config, obs_dim: int = 2) -> SACLSTMLearner:
    """A learner whose target critic outputs 10 everywhere and whose alpha is ~0, so that every
    TD target is known: rewards plus discounted 10s."""
    learner = SACLSTMLearner(obs_dim, 1, cfg)
    with torch.no_grad():
        for p in learner.target.parameters():
            p.zero_()
        learner.target.b2.fill_(10.0)
        learner.log_alpha.fill_(-30.0)  # alpha ~ 0: no entropy term in the target
    return learner


def _update_seeing_q(learner: SACLSTMLearner, batch) -> tuple[dict, torch.Tensor]:
    """update()'s metrics and the critic's Q of the replayed actions (T, B), before its step."""
    captured = {}
    orig = learner.critic.heads

    def spy(hw, act, detach_params=False):
        q = orig(hw, act, detach_params)
        if not detach_params:
            captured["q"] = q
        return q

    learner.critic.heads = spy
    return learner.update(batch), captured["q"].detach()


def _critic_loss(q: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    """update()'s critic loss for targets y: the squared TD error over the masked steps."""
    return float((((q - y) ** 2) * mask).sum() / mask.sum())


def test_target_uses_one_minus_terminated():
    """With gamma=1 and a critic whose target is known, terminated steps must not bootstrap
    while truncated ones must."""
    learner = _learner_whose_target_says_10(Config(quant="off", gamma=1.0, seed=0, hidden=8))
    buf = SequenceReplay(64, 2, 1)
    for _ in range(32):
        buf.add([0, 0], [0.0], 1.0, [0, 0], True, False)   # an episode that terminates
        buf.add([0, 0], [0.0], 1.0, [0, 0], False, True)   # an episode that is truncated
    batch = buf.sample(64, 1, np.random.default_rng(0))
    assert 0 < batch.terminated.sum() < 64 and batch.truncated.sum() == 64 - batch.terminated.sum()
    # Recompute y the way update() does, through its loss: loss = sum_heads mean (q - y)^2
    m, q_before = _update_seeing_q(learner, batch)
    term, rew, mask = (torch.as_tensor(x).T for x in (batch.terminated, batch.rew, batch.mask))  # (T, B)
    y = rew + (1 - term) * 10.0
    expected = _critic_loss(q_before, y, mask)
    assert m["critic_loss"] == pytest.approx(expected, rel=1e-5)
    wrong_y = rew + 10.0  # bootstrapping through termination
    wrong = _critic_loss(q_before, wrong_y, mask)
    assert abs(m["critic_loss"] - wrong) > 1.0


def _n_step_by_hand(rew, term, trunc, valid, v_next, gamma, n):
    """The n-step target written out step by step, per sequence, as the docstring states it."""
    T, B = rew.shape
    y = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            if not valid[t, b]:
                continue
            total, k = 0.0, 0
            while True:
                total += gamma**k * rew[t + k, b]
                ended = term[t + k, b] or trunc[t + k, b]
                if ended or k == n - 1 or t + k + 1 >= T or not valid[t + k + 1, b]:
                    total += gamma ** (k + 1) * (1 - term[t + k, b]) * v_next[t + k, b]
                    break
                k += 1
            y[t, b] = total
    return y


@pytest.mark.parametrize("n", [1, 2, 5, 40])
def test_n_step_targets_match_the_sum_written_out(n):
    """Ends of episodes (terminated: no bootstrap; truncated: bootstrap) and of the window
    (padding) cut the sum short; n past the window's length is the same as its length."""
    rng = np.random.default_rng(n)
    T, B, gamma = 12, 64, 0.9
    rew, v_next = rng.normal(size=(T, B)), rng.normal(size=(T, B))
    ends = rng.random((T, B))
    term, trunc = (ends < 0.08).astype(float), ((ends >= 0.08) & (ends < 0.16)).astype(float)
    valid = np.ones((T, B))
    for b in range(B):  # windows that reached an episode's end, or the newest data, are padded
        stop = rng.integers(1, T + 1)
        valid[stop:, b] = 0
        rew[stop:, b] = term[stop:, b] = trunc[stop:, b] = 0
    got = n_step_targets(*(torch.as_tensor(x, dtype=torch.float64) for x in (rew, term, trunc, valid, v_next)),
                         gamma, n).numpy()
    want = _n_step_by_hand(rew, term, trunc, valid, v_next, gamma, n)
    np.testing.assert_allclose(got * valid, want, rtol=1e-12, atol=1e-12)
    if n == 1:  # the one-step target, as update() computed it before n-step returns
        np.testing.assert_allclose(got * valid, (rew + gamma * (1 - term) * v_next) * valid, atol=1e-12)
    else:  # and n > 1 differs from it wherever a sum went past one step
        assert np.abs(got - _n_step_by_hand(rew, term, trunc, valid, v_next, gamma, 1)).max() > 0.1


@pytest.mark.parametrize("memoryless", [False, True])
def test_update_uses_n_step_targets_and_the_control_keeps_one_step(memoryless):
    """Through update(): a target critic that says 10 everywhere, alpha ~ 0, gamma 0.5, n_step 3;
    the critic loss must be the one for the 3-step sums over each window (written out by hand),
    and for the memoryless control (one-step sequences) the one-step target."""
    learner = _learner_whose_target_says_10(Config(quant="off", gamma=0.5, n_step=3, seed=0, hidden=8,
                                                   memoryless=memoryless))
    buf = SequenceReplay(256, 2, 1)
    rng = np.random.default_rng(0)
    for i in range(200):  # episodes of 7 steps that terminate, of 5 that are truncated
        buf.add([0, 0], [0.0], float(rng.normal()), [0, 0], i % 12 == 6, i % 12 == 11)
    seq = 1 if memoryless else 6
    # Burn-in: windows near an episode's start get fewer warm-up steps and real steps after the
    # trained ones (valid, not in the loss), which the sums must still run through.
    batch = buf.sample(64 if memoryless else 16, seq, np.random.default_rng(1), 0 if memoryless else 3)
    m, q = _update_seeing_q(learner, batch)
    q = q.double()
    rew, term, trunc, valid, mask = (np.asarray(x, np.float64).T for x in
                                     (batch.rew, batch.terminated, batch.truncated, batch.valid, batch.mask))
    y = _n_step_by_hand(rew, term, trunc, valid, np.full(rew.shape, 10.0), 0.5, 1 if memoryless else 3)
    y = torch.as_tensor(y)
    mask_t = torch.as_tensor(mask)
    expected = _critic_loss(q, y, mask_t)
    assert m["critic_loss"] == pytest.approx(expected, rel=1e-4)
    if not memoryless:  # and it is not the one-step loss
        y1 = torch.as_tensor(_n_step_by_hand(rew, term, trunc, valid, np.full(rew.shape, 10.0), 0.5, 1))
        assert abs(_critic_loss(q, y1, mask_t) - m["critic_loss"]) > 0.1


def _memory_run(memoryless: bool, steps: int = 1500, seed: int = 0) -> float:
    cfg = Config(hidden=32, batch_size=32, seq_len=1 if memoryless else 4, lr=1e-3, gamma=0.9,
                 calib_updates=200, seed=seed)
    learner = SACLSTMLearner(3, 1, cfg)
    buf, rng = SequenceReplay(10_000, 3, 1), np.random.default_rng(seed)
    env, arng = CueMemory(delay=2), np.random.default_rng(seed + 1)
    env.reset(seed=seed)
    params = policy.build_params(learner.export_actor())
    n, warmup = 0, 300
    while n < steps:
        obs, _ = env.reset()
        st, done = policy.initial_state(params), False
        while not done:
            if memoryless:  # the control: recurrent state (and previous action) reset every step
                st = policy.initial_state(params)
            a, st = policy.act(params, obs, st, arng)
            if n < warmup:
                a = arng.uniform(-1, 1, 1).astype(np.float32)
                st = st._replace(prev_act=a)
            nobs, r, term, trunc, _ = env.step(a)
            buf.add(obs, a, r, nobs, term, trunc)
            obs, done, n = nobs, term or trunc, n + 1
            if n >= warmup:
                b = buf.sample(cfg.batch_size, cfg.seq_len, rng)
                if memoryless:
                    b = b._replace(prev_act0=np.zeros_like(b.prev_act0))
                learner.update(b)
        if n % 500 < 4:
            params = policy.build_params(learner.export_actor())
    params = policy.build_params(learner.export_actor())
    wins = 0
    for _ in range(200):
        obs, _ = env.reset()
        st, done = policy.initial_state(params), False
        while not done:
            if memoryless:
                st = policy.initial_state(params)
            a, st = policy.act(params, obs, st)
            obs, _, term, trunc, info = env.step(a)
            done = term or trunc
        wins += info["success"]
    return wins / 200


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_memory_task_needs_the_lstm():
    lstm = _memory_run(memoryless=False)
    control = _memory_run(memoryless=True)
    assert lstm >= 0.9, f"LSTM learner reached only {lstm:.0%}"
    assert 0.3 <= control <= 0.7, f"memoryless control should stay near chance, got {control:.0%}"


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="counts oneDNN's LSTM kernels")
def test_update_runs_three_lstm_passes_forward_and_two_backward():
    """The point of the shared critic core: actor, critic and target forward once
    each, and only actor and critic backward, against 8 and 5 in the naive layout."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    calls = {"fwd": 0, "bwd": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket is aten.mkldnn_rnn_layer:
                calls["fwd"] += 1
            elif func._overloadpacket is aten.mkldnn_rnn_layer_backward:
                calls["bwd"] += 1
            return func(*args, **(kwargs or {}))

    learner, buf, rng = trained_learner(updates=5)  # past calibration: the quantized path
    batch = buf.sample(16, 32, rng)
    with Count():
        learner.update(batch)
    assert calls == {"fwd": 3, "bwd": 2}


def test_critic_obs_values_reach_the_critic_and_never_the_actor():
    """Config.critic_obs: the observation's last k values are the critic's alone.  The torch actor
    and the deployed numpy actor give the same actions whatever those values hold, and match each
    other; the critic's values do change with them, and the learner trains on them."""
    k = 5
    cfg = Config(calib_updates=4, hidden=16, seed=0, init_alpha=0.02, critic_obs=k)
    learner = SACLSTMLearner(OBS, ACT, cfg)
    buf, rng = filled_replay(seed=0), np.random.default_rng(0)
    for _ in range(8):
        learner.update(buf.sample(8, 16, rng))
    params = policy.build_params(learner.export_actor())
    assert params.obs_dim == OBS and params.n_obs == OBS - k
    assert learner.export_actor()["fc1.w"].shape == (16, OBS - k + ACT)
    obs = (np.random.default_rng(1).standard_normal((30, OBS)) * 1.5).astype(np.float32)
    other = obs.copy()
    other[:, -k:] = np.random.default_rng(2).uniform(-1.5, 1.5, (30, k))
    runs = []
    for o in (obs, other):
        st, acts = policy.initial_state(params), []
        for t in range(30):
            a, st = policy.act(params, o[t], st, None)
            acts.append(a)
        runs.append(np.array(acts))
    assert np.array_equal(runs[0], runs[1])
    with torch.no_grad():
        prev = torch.cat([torch.zeros(1, 1, ACT), torch.as_tensor(runs[0])[:-1, None]], 0)
        mus = [learner.actor(torch.as_tensor(o)[:, None], prev)[0] for o in (obs, other)]
        assert torch.equal(mus[0], mus[1])
        assert np.abs(torch.tanh(mus[0])[:, 0].numpy() - runs[0]).max() <= 1e-5
        qs = [learner.critic.heads(learner.critic.head_input(learner.critic.core(torch.as_tensor(o)[:, None], prev)),
                                   torch.as_tensor(runs[0])[:, None]) for o in (obs, other)]
        assert (qs[0] - qs[1]).abs().max() > 1e-4  # the critic reads them
    with pytest.raises(ValueError, match="critic_obs = 35 leaves the actor nothing"):
        SACLSTMLearner(OBS, ACT, Config(critic_obs=OBS))


@pytest.mark.parametrize("critic_memory", [True, False])
def test_a_critic_without_memory_reads_each_step_alone(critic_memory):
    """--no-critic-memory: the critic's Q at a step does not depend on the observations before it
    (and with memory it does); the actor still reads the window as a sequence."""
    cfg = Config(quant="off", seed=0, hidden=8, critic_memory=critic_memory)
    buf = SequenceReplay(256, 2, 1)
    rng = np.random.default_rng(0)
    for i in range(100):
        buf.add(rng.normal(size=2), [float(rng.uniform(-1, 1))], 0.0, rng.normal(size=2), False, i % 50 == 49)
    batch = buf.sample(8, 6, np.random.default_rng(1))
    changed = batch._replace(obs=batch.obs.copy())
    changed.obs[:, 0] += 5.0  # the first step of every window

    def seen(b):  # Q of the replayed actions (2, T, B), and what the target critic's heads read (T, B, .)
        learner = SACLSTMLearner(2, 1, cfg)
        targ, orig = {}, learner.target.head_input

        def spy(h):
            targ["h"] = h
            return orig(h)

        learner.target.head_input = spy
        return _update_seeing_q(learner, b)[1], targ["h"]

    (q, targ), (q2, targ2) = seen(batch), seen(changed)
    later = (q[:, 1:] - q2[:, 1:]).abs().max().item()  # (2 heads, T, B): steps after the first
    assert (q[:, 0] - q2[:, 0]).abs().max().item() > 1e-4  # the changed step itself moves
    targ_moved = (targ - targ2).abs().max().item()  # the target reads steps 1..T: never the changed one
    if critic_memory:
        assert later > 1e-4 and targ_moved > 1e-4
    else:
        assert later == 0.0 and targ_moved == 0.0
    # It still reads the previous action beside each step (the control's critic reads zeros).
    acted = batch._replace(act=batch.act.copy())
    acted.act[:, 0] = -acted.act[:, 0] + 0.5
    assert (q[:, 1] - seen(acted)[0][:, 1]).abs().max().item() > 1e-4


def test_the_critic_layer_norm_normalizes_each_head_on_its_own(monkeypatch):
    """Layer norm in the critic (the default): each head's hidden layer, before its gain and bias, has mean 0 and
    variance 1 over its 128 units, whatever scale its inputs come at; an update trains the gains."""
    cfg = Config(quant="off", seed=0, hidden=8, critic_layer_norm=True)
    learner = SACLSTMLearner(2, 1, cfg)
    critic, seen = learner.critic, {}
    orig = torch.nn.functional.layer_norm

    def spy(x, shape, *args, **kw):
        seen["y"] = orig(x, shape, *args, **kw)
        return seen["y"]

    monkeypatch.setattr(torch.nn.functional, "layer_norm", spy)
    obs = torch.as_tensor(np.random.default_rng(0).normal(size=(5, 4, 2)) * 100.0, dtype=torch.float32)
    q = critic.heads(critic.head_input(critic.core(obs, torch.zeros(5, 4, 1))), torch.full((5, 4, 1), 0.3))
    y = seen["y"]
    assert tuple(y.shape) == (20, 2, 128) and tuple(q.shape) == (2, 5, 4)
    assert y.mean(-1).abs().max().item() < 1e-4 and (y.var(-1, unbiased=False) - 1).abs().max().item() < 1e-2
    buf = SequenceReplay(256, 2, 1)
    rng = np.random.default_rng(0)
    for i in range(100):
        buf.add(rng.normal(size=2), [float(rng.uniform(-1, 1))], float(rng.normal()), rng.normal(size=2), False,
                i % 50 == 49)
    gain = critic.ln_w.detach().clone()
    learner.update(buf.sample(8, 6, np.random.default_rng(1)))
    assert (critic.ln_w.detach() - gain).abs().max().item() > 0
    assert [p.shape for p in learner.target.parameters()] == [p.shape for p in critic.parameters()]
    assert hasattr(SACLSTMLearner(2, 1, Config(quant="off", seed=0, hidden=8)).critic, "ln_w")  # the default
    assert not hasattr(SACLSTMLearner(2, 1, dataclasses.replace(cfg, critic_layer_norm=False)).critic, "ln_w")


@pytest.mark.parametrize("layer_norm", [False, True])
def test_deeper_q_heads_compute_each_head_as_a_plain_mlp_and_train(layer_norm):
    """--critic-head-layers 3 --critic-head-width 16: each Q head is [h_t, a_t] -> 16 -> 16 -> 16 -> 1
    with its own weights (layer norm, when on, on every hidden layer); the actor loss reaches the
    action but no critic weight; an update trains every layer; a saved deeper critic does not
    load into a shallower one."""
    cfg = Config(quant="off", seed=0, hidden=8, critic_head_layers=3, critic_head_width=16,
                 critic_layer_norm=layer_norm)
    learner = SACLSTMLearner(2, 1, cfg)
    c = learner.critic
    rng = np.random.default_rng(0)
    obs = torch.as_tensor(rng.normal(size=(5, 4, 2)), dtype=torch.float32)
    act = torch.as_tensor(rng.uniform(-1, 1, (5, 4, 1)), dtype=torch.float32).requires_grad_()
    h = c.core(obs, torch.zeros(5, 4, 1))
    q = c.heads(c.head_input(h), act)

    def norm(y, w, b):
        return torch.nn.functional.layer_norm(y, (16,)) * w + b

    x = torch.cat([h.reshape(20, 8), act.reshape(20, 1)], -1)
    for k in range(2):  # each head by hand, from the stacked weights
        y = x @ torch.cat([c.w1h[k], c.w1a[k]]) + c.b1[k]
        y = torch.relu(norm(y, c.ln_w[k], c.ln_b[k]) if layer_norm else y)
        for i in range(2):
            y = y @ c.mid_w[i][k] + c.mid_b[i][k]
            y = torch.relu(norm(y, c.mid_ln_w[i][k], c.mid_ln_b[i][k]) if layer_norm else y)
        ref = (y @ c.w2[k] + c.b2[k]).view(5, 4)
        assert (q[k] - ref).abs().max().item() < 1e-5
    c.zero_grad()
    c.heads(c.head_input(h), act, detach_params=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum().item() > 0
    assert all(p.grad is None for n, p in c.named_parameters() if not n.startswith(("fc1", "lstm")))
    buf = SequenceReplay(256, 2, 1)
    for i in range(100):
        buf.add(rng.normal(size=2), [float(rng.uniform(-1, 1))], float(rng.normal()), rng.normal(size=2), False,
                i % 50 == 49)
    before = {n: p.detach().clone() for n, p in c.named_parameters()}
    learner.update(buf.sample(8, 6, np.random.default_rng(1)))
    assert [n for n, p in c.named_parameters() if torch.equal(p.detach(), before[n])] == []
    assert [p.shape for p in learner.target.parameters()] == [p.shape for p in c.parameters()]
    arrays, meta = learner.state()
    shallower = SACLSTMLearner(2, 1, dataclasses.replace(cfg, critic_head_layers=2))
    with pytest.raises(ValueError, match="critic parameters this one lacks: critic.mid_"):
        shallower.load_state(arrays, meta)
    same = SACLSTMLearner(2, 1, dataclasses.replace(cfg, seed=5))
    same.load_state(arrays, meta)
    assert torch.equal(same.critic.mid_w[1], c.mid_w[1])
    other_norm = SACLSTMLearner(2, 1, dataclasses.replace(cfg, critic_layer_norm=not layer_norm))
    with pytest.raises(ValueError, match=f"saved learner {'has' if layer_norm else 'lacks'} critic parameters "
                                         r".*critic\.(mid_)?ln_.*another critic_layer_norm or critic_head_layers"):
        other_norm.load_state(arrays, meta)


def test_one_layer_q_heads_keep_the_parameters_they_always_had():
    """Plain heads (one hidden layer of 128, no layer norm) have no deeper layers' parameters, so
    bots saved before those settings load as they are; the default adds only the norm's gain and bias."""
    plain = SACLSTMLearner(2, 1, Config(quant="off", seed=0, hidden=8, critic_layer_norm=False)).critic
    before = ["b1", "b2", "fc1.bias", "fc1.weight", "lstm.bias_hh_l0", "lstm.bias_ih_l0",
              "lstm.weight_hh_l0", "lstm.weight_ih_l0", "w1a", "w1h", "w2"]
    assert sorted(plain.state_dict()) == before
    assert tuple(plain.w1h.shape) == (2, 8, 128)
    default = SACLSTMLearner(2, 1, Config(quant="off", seed=0, hidden=8)).critic
    assert set(default.state_dict()) - set(before) == {"ln_w", "ln_b"}


def test_a_cpu_device_number_is_refused_as_selecting_nothing():
    from sacbot.config import ConfigError
    from sacbot.learning.sac import resolve_device

    assert str(resolve_device("cpu")) == "cpu" and str(resolve_device("cpu:0")) == "cpu:0"
    with pytest.raises(ConfigError, match="device = 'cpu:5' is not accepted: expected cpu, cuda or cuda:N"):
        resolve_device("cpu:5")

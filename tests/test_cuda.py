"""The learner on a CUDA device (``--device cuda``).

Most of these need a GPU that torch can see; CI has none, so there they are skipped and
only the check that asking for CUDA without a GPU is a clear configuration error runs.
On a GPU machine: ``pytest tests/test_cuda.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_learner import ACT, OBS, filled_replay

from sacbot.acting import policy
from sacbot.config import Config
from sacbot.learning.sac import SACLSTMLearner

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")
SACBOT = [sys.executable, "-m", "sacbot"]


def cuda_learner(updates=12, device="cuda", seed=0, quant="on"):
    learner = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=seed, device=device, quant=quant))
    buf, rng = filled_replay(seed=seed), np.random.default_rng(seed)
    metrics = [learner.update(buf.sample(16, 32, rng)) for _ in range(updates)]
    return learner, buf, rng, metrics


@needs_cuda
@pytest.mark.parametrize("quant", ["on", "off"])
def test_cuda_learner_trains_there_and_its_export_matches_the_numpy_policy(quant):
    learner, _, _, metrics = cuda_learner(quant=quant)
    assert learner.quant_phase == ("training" if quant == "on" else "off")
    assert str(learner.device) == "cuda:0"
    assert all(p.is_cuda for p in learner.actor.parameters())
    assert all(p.is_cuda for p in learner.critic.parameters())
    assert all(np.isfinite(v) for m in metrics for v in m.values())
    # The critic learned something: its loss is not what it was at the first update.
    assert metrics[-1]["critic_loss"] != metrics[0]["critic_loss"]
    params = policy.build_params(learner.export_actor())
    obs = (np.random.default_rng(1).standard_normal((100, OBS)) * 1.5).astype(np.float32)
    st, acts = policy.initial_state(params), []
    for t in range(100):
        a, st = policy.act(params, obs[t], st)
        acts.append(a)
    acts = np.array(acts)
    with torch.no_grad():
        prev = torch.cat([torch.zeros(1, 1, ACT), torch.as_tensor(acts)[:-1, None]], 0).cuda()
        mu, _, _ = learner.actor(torch.as_tensor(obs)[:, None].cuda(), prev)
        ref = torch.tanh(mu)[:, 0].cpu().numpy()
    diff = np.abs(ref - acts).max()
    assert diff <= 1e-5, f"numpy policy against the CUDA actor: max diff {diff}"


def critic_q(learner, batch) -> np.ndarray:
    """The critic's twin Q values of the batch's own actions, (2, T, B), as the update computes them."""
    obs = torch.as_tensor(batch.obs, device=learner.device).transpose(0, 1)
    act = torch.as_tensor(batch.act, device=learner.device).transpose(0, 1)
    prev = torch.cat([torch.as_tensor(batch.prev_act0, device=learner.device).unsqueeze(0), act], 0)
    with torch.no_grad():
        hw = learner.critic.head_input(learner.critic.core(obs[:-1], prev[:-1]))
        return learner.critic.heads(hw, act).cpu().numpy()


def test_critic_q_reads_the_critic():
    """critic_q, which the device test above relies on, on the CPU: a copy of a trained learner
    gives the same values, and a learner with other weights does not."""
    a, buf, rng, _ = cuda_learner(updates=6, device="cpu")
    batch = buf.sample(16, 32, rng)
    copy = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=9))
    copy.load_state(*a.state())
    q = critic_q(a, batch)
    assert q.shape == (2, 32, 16)
    np.testing.assert_array_equal(critic_q(copy, batch), q)
    other = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=9))
    assert np.abs(critic_q(other, batch) - q).max() > 1e-3


@needs_cuda
def test_learner_state_moves_between_cuda_and_cpu(caplog):
    a, buf, rng, _ = cuda_learner(updates=8)
    arrays, meta = a.state()
    b = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=5))
    # The reseed is said on the "sacbot" logger (what a user's run shows), not as a warning.
    with caplog.at_level("WARNING", logger="sacbot"):
        b.load_state({k: v.copy() for k, v in arrays.items()}, meta)
    assert sum("reseeded" in r.getMessage() for r in caplog.records) == 1
    sb, _ = b.state()
    for k in arrays:
        if k != "rng.torch":
            assert np.array_equal(arrays[k], sb[k]), k
    # The same parameters export the same actor, up to the last bit of exp() (the scales
    # are learned as logs), which CUDA and the CPU may round differently.
    ea, eb = a.export_actor(), b.export_actor()
    assert ea.keys() == eb.keys()
    for k in ea:
        if ea[k].dtype == np.int8:  # a 1-ulp scale can move a value across a rounding edge
            d = np.abs(ea[k].astype(int) - eb[k].astype(int))
            assert d.max() <= 1 and d.mean() < 1e-3, k
        else:
            np.testing.assert_allclose(ea[k], eb[k], rtol=1e-6, atol=0, err_msg=k)
    # And back onto the GPU: it trains on from the CPU learner's state.
    c = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=7, device="cuda"))
    caplog.clear()
    with caplog.at_level("WARNING", logger="sacbot"):
        c.load_state(*b.state())
    assert sum("reseeded" in r.getMessage() for r in caplog.records) == 1
    batch = buf.sample(16, 32, rng)
    # Same weights, same batch: the twin Q values of the batch's actions agree to float
    # tolerance.  (Not the critic loss: its target uses fresh action noise, which differs
    # after the reseed; on an H200 the two losses were 7.6% apart.)
    np.testing.assert_allclose(critic_q(c, batch), critic_q(b, batch), rtol=1e-4, atol=1e-4)
    b.update(batch)
    c.update(batch)
    assert c.updates == b.updates == 9
    assert float(c.opt_critic.state[c._critic_params[0]]["step"]) == 9.0


def test_a_generator_state_from_another_device_kind_reseeds_reproducibly_and_says_so(caplog):
    """The CPU half of the move above, which CI can run: a CUDA generator's state (seed and
    offset, 16 bytes) does not fit a CPU one, so loading it reseeds from the seed and the
    update count, the same way every time, and says so on the sacbot logger."""
    arrays, meta = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=3)).state()
    arrays["rng.torch"] = np.arange(16, dtype=np.uint8)  # the size of a CUDA generator's state
    meta = {**meta, "updates": 40}
    draws = []
    for _ in range(2):
        learner = SACLSTMLearner(OBS, ACT, Config(calib_updates=4, seed=3))
        caplog.clear()
        with caplog.at_level("WARNING", logger="sacbot"):
            learner.load_state({k: v.copy() for k, v in arrays.items()}, meta)
        assert sum("reseeded" in r.getMessage() for r in caplog.records) == 1
        draws.append(torch.randn(8, generator=learner.gen))
    assert torch.equal(draws[0], draws[1])
    expected = torch.randn(8, generator=torch.Generator().manual_seed(3 + 1 + 40))
    assert torch.equal(draws[0], expected)


@needs_cuda
@pytest.mark.timeout(300)
def test_sacbot_run_on_cuda_checkpoints_and_resumes_on_cpu(tmp_path):
    common = ["--env", "Pendulum-v1", "--pace", "lockstep", "--learning-starts", "200",
              "--weights-path", str(tmp_path / "w"), "--quiet"]
    p = subprocess.run(SACBOT + ["run", "--device", "cuda", "--steps", "600", "--run-dir",
                                 str(tmp_path / "gpu"), *common], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    status = json.loads((tmp_path / "gpu" / "status.json").read_text())
    assert status["device"] == "cuda:0" and status["learner_steps"] >= 300
    assert (tmp_path / "w" / "sac_latest.zip").exists()
    p = subprocess.run(SACBOT + ["run", "--device", "cpu", "--steps", "800", "--run-dir",
                                 str(tmp_path / "cpu"), *common], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    status = json.loads((tmp_path / "cpu" / "status.json").read_text())
    assert status["device"] == "cpu" and status["loaded_from"]
    assert status["learner_steps"] > 400 and "reseeded" in p.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible")
def test_asking_for_cuda_without_a_gpu_is_a_configuration_error(tmp_path):
    p = subprocess.run(SACBOT + ["run", "--device", "cuda", "--steps", "10", "--run-dir", str(tmp_path / "r"),
                                 "--weights-path", str(tmp_path / "w"), "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "device = 'cuda'" in p.stderr and "--device cpu" in p.stderr
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())

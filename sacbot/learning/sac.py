"""SAC-LSTM learner: networks, the update and the actor export, top to bottom in one file.

Usage::

    learner = SACLSTMLearner(obs_dim, act_dim, cfg)
    while training:
        metrics = learner.update(replay.sample(cfg.batch_size, cfg.seq_len, rng))
        snapshot.publish(learner.export_actor())
    arrays, meta = learner.state()          # plain arrays + JSON-able scalars
    other.load_state(arrays, meta)          # bitwise-identical continuation

Layout (after pomdp-baselines, Ni et al. 2022): actor and critic each encode the history
(obs_t, a_{t-1}) with their own fc1 -> LSTM.  The critic's recurrent core runs **once** per
update and serves both Q heads, the replayed actions and the policy's actions; the target
critic is a polyak copy of core and heads.  A naive layout (one recurrent network per Q, the
yardstick of ``tools/bench/learner.py``) runs 8 LSTM passes forward and 5 backward per
update; this one runs 3 forward (actor, critic, target) and 2 backward.

Only the actor is quantization-aware: it is the only network that is deployed, so
quantizing the critics would add noise and cost for nothing.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from sacbot.config import Config, ConfigError
from sacbot.learning.quant import OFF, PHASE_NAMES, QLSTM, QUANTIZING, QLinear
from sacbot.learning.replay import SequenceBatch
from sacbot.wire.snapshot import LOG_STD_MAX, LOG_STD_MIN

# CleanRL's soft clamp of the log-std: a hard clamp would zero its gradient.
FC_HIDDEN = 128  # fc2 width of actor and critic


def squash_log_std(raw: torch.Tensor) -> torch.Tensor:
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1.0)


def tanh_log_prob(u: torch.Tensor, mu: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(a) for a = tanh(u), u ~ N(mu, std): Gaussian log-density minus
    sum log|da/du|, with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), which stays
    finite where 1 - a^2 rounds to 0 (SAC paper, appendix C)."""
    z = (u - mu) / log_std.exp()
    gauss = -0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    correction = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (gauss - correction).sum(-1)


def n_step_targets(rew: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                   valid: torch.Tensor, v_next: torch.Tensor, gamma: float, n: int) -> torch.Tensor:
    """Soft TD targets over up to ``n`` rewards, all (T, B) time-major; ``v_next[t]`` is the soft
    value of the observation after step t.

    y_t = r_t + g r_{t+1} + ... + g^(m-1) r_{t+m-1} + g^m (1 - terminated_{t+m-1}) v_next[t+m-1],
    where m <= n stops early at the episode's end (terminated or truncated: neither is summed
    across) and at the window's last real step.  n = 1 is the one-step target.  A reward that
    lands ~30 ticks after the shot that earned it (TankDuel) reaches the shot's value in 30 / n
    bootstraps instead of 30.  Like R2D2's n-step, it is not corrected for the policy that acted.
    """
    def ahead(x: torch.Tensor, j: int) -> torch.Tensor:  # row t holds x[t + j]; zeros past the window
        return torch.cat([x[j:], x.new_zeros((min(j, x.shape[0]), *x.shape[1:]))]) if j else x

    y = torch.zeros_like(rew)
    alive = valid.bool()  # step t still summing rewards
    discount = 1.0
    for k in range(min(n, rew.shape[0])):  # by the window's last step every sum has stopped
        r_k, term_k, v_k = ahead(rew, k), ahead(terminated, k), ahead(v_next, k)
        y = y + alive.to(y.dtype) * discount * r_k
        # Bootstrap where the sum stops: after n rewards, at the episode's end, or at the window's.
        stop = alive & ((term_k + ahead(truncated, k) > 0) | (k == n - 1) | (ahead(valid, k + 1) <= 0))
        y = y + stop.to(y.dtype) * (discount * gamma) * (1.0 - term_k) * v_k
        alive = alive & ~stop
        discount *= gamma
    return y


class Actor(nn.Module):
    """fc1 -> LSTM(h) -> fc2(128) -> [mean | log-std] head, all quantization-aware.  It reads the
    observation's first ``obs_dim - critic_obs`` values: the rest are for the critic alone."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, quant: bool, bits: int, critic_obs: int = 0):
        super().__init__()
        q = dict(quant=quant, bits=bits)
        self.act_dim, self.n_obs = act_dim, obs_dim - critic_obs
        self.fc1 = QLinear(self.n_obs + act_dim, hidden, input_signed=True, **q)
        self.lstm = QLSTM(hidden, hidden, input_signed=False, **q)  # input is post-ReLU
        self.fc2 = QLinear(hidden, FC_HIDDEN, input_signed=True, **q)  # LSTM h in (-1, 1)
        self.head = QLinear(FC_HIDDEN, 2 * act_dim, input_signed=False, **q)

    def quant_layers(self) -> list[QLinear | QLSTM]:
        return [self.fc1, self.lstm, self.fc2, self.head]

    def forward(self, obs: torch.Tensor, prev_act: torch.Tensor, hc=None):
        """Returns (mean, log_std, hc) for every step of a time-major (T, B, .) sequence."""
        z = F.relu(self.fc1(torch.cat([obs[..., : self.n_obs], prev_act], -1)))
        h, hc = self.lstm(z, hc)
        mu, raw = self.head(F.relu(self.fc2(h))).split(self.act_dim, -1)
        return mu, squash_log_std(raw), hc


class Critic(nn.Module):
    """One recurrent core for the history, twin Q heads on [h_t, a_t]: ``layers`` hidden layers of
    ``width`` each (Config.critic_head_layers, critic_head_width).  With ``layer_norm``
    (Config.critic_layer_norm) each head normalizes every hidden layer before its ReLU."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, layer_norm: bool = False, layers: int = 1,
                 width: int = FC_HIDDEN):
        super().__init__()
        self.layer_norm, self.width = layer_norm, width
        self.fc1 = nn.Linear(obs_dim + act_dim, hidden)
        self.lstm = nn.LSTM(hidden, hidden)  # time-major: see SACLSTMLearner.update
        # Twin heads as stacked (2, in, out) weights so both run in one batched matmul;
        # the first layer is split into its h and a parts (see ``heads``).
        heads = [nn.Linear(hidden + act_dim, width) for _ in range(2)]
        outs = [nn.Linear(width, 1) for _ in range(2)]
        w1 = torch.stack([lin.weight.detach().t() for lin in heads])
        self.w1h = nn.Parameter(w1[:, :hidden].clone())
        self.w1a = nn.Parameter(w1[:, hidden:].clone())
        self.b1 = nn.Parameter(torch.stack([lin.bias.detach() for lin in heads]).unsqueeze(1))
        self.w2 = nn.Parameter(torch.stack([lin.weight.detach().t() for lin in outs]))
        self.b2 = nn.Parameter(torch.stack([lin.bias.detach() for lin in outs]).unsqueeze(1))
        if layer_norm:  # each head's own gain and bias
            self.ln_w = nn.Parameter(torch.ones(2, width))
            self.ln_b = nn.Parameter(torch.zeros(2, width))
        # Hidden layers after the first (none by default, which leaves a one-layer critic's
        # parameters, their order and their initial values as they were): (2, width, width) each.
        self.mid_w, self.mid_b = nn.ParameterList(), nn.ParameterList()
        self.mid_ln_w, self.mid_ln_b = nn.ParameterList(), nn.ParameterList()
        for _ in range(layers - 1):
            mids = [nn.Linear(width, width) for _ in range(2)]
            self.mid_w.append(nn.Parameter(torch.stack([lin.weight.detach().t() for lin in mids])))
            self.mid_b.append(nn.Parameter(torch.stack([lin.bias.detach() for lin in mids]).unsqueeze(1)))
            if layer_norm:
                self.mid_ln_w.append(nn.Parameter(torch.ones(2, 1, width)))
                self.mid_ln_b.append(nn.Parameter(torch.zeros(2, 1, width)))

    def core(self, obs: torch.Tensor, prev_act: torch.Tensor, memory: bool = True) -> torch.Tensor:
        """h for every step of time-major (T, B, .) inputs.  Without ``memory`` (Config.critic_memory)
        each step is a sequence of its own, from a zero state."""
        if not memory:
            T, B = obs.shape[:2]
            return self.core(obs.reshape(1, T * B, -1), prev_act.reshape(1, T * B, -1)).reshape(T, B, -1)
        h, _ = self.lstm(F.relu(self.fc1(torch.cat([obs, prev_act], -1))))
        return h

    def head_input(self, h: torch.Tensor) -> torch.Tensor:
        """The h-dependent half of the heads' first layer, (T*B, 2*width): both heads side
        by side.  The replayed and the policy's actions share it, so it is computed once
        per update."""
        H = h.shape[-1]
        # One wide addmm instead of a broadcast (2, in, out) bmm: the bmm's backward made
        # contiguous copies of (2, 512, 128) tensors that cost ~1 ms per update.
        w1h = self.w1h.permute(1, 0, 2).reshape(H, -1)
        return torch.addmm(self.b1.reshape(-1), h.reshape(-1, H), w1h)

    def heads(self, hw: torch.Tensor, act: torch.Tensor, detach_params: bool = False):
        """Q1, Q2 of shape (2, T, B) from ``head_input(h)`` and actions (T, B, A).
        ``detach_params`` lets the actor loss use the critic without sending gradient
        into it, so one backward serves all three losses."""
        def p(x: torch.Tensor) -> torch.Tensor:
            return x.detach() if detach_params else x

        T, B, A = act.shape
        W = self.width
        y = torch.addmm(p(hw), act.reshape(T * B, A), p(self.w1a).permute(1, 0, 2).reshape(A, -1))
        if self.layer_norm:
            y = (F.layer_norm(y.view(T * B, 2, W), (W,)) * p(self.ln_w) + p(self.ln_b)).view(T * B, -1)
        y = F.relu(y)
        if not len(self.mid_w):
            # Second layer (width -> 1 per head) as one matmul with a block-diagonal (2*width, 2)
            # weight; a multiply-and-sum over each head's half cost ~1 ms more per update.
            q = torch.addmm(p(self.b2).view(2), y, torch.block_diag(*p(self.w2)))
            return q.t().view(2, T, B)
        y = y.view(T * B, 2, W).transpose(0, 1)  # (2, T*B, W): each head's rows apart
        for i in range(len(self.mid_w)):
            y = torch.baddbmm(p(self.mid_b[i]), y, p(self.mid_w[i]))
            if self.layer_norm:
                y = F.layer_norm(y, (W,)) * p(self.mid_ln_w[i]) + p(self.mid_ln_b[i])
            y = F.relu(y)
        return torch.baddbmm(p(self.b2), y, p(self.w2)).view(2, T, B)


class SACLSTMLearner:
    def __init__(self, obs_dim: int, act_dim: int, cfg: Config):
        self.cfg, self.obs_dim, self.act_dim = cfg, obs_dim, act_dim
        if not 0 <= cfg.critic_obs < obs_dim:
            raise ValueError(f"critic_obs = {cfg.critic_obs} leaves the actor nothing of a {obs_dim}-value "
                             "observation: it must be less than the observation's size")
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            # The deployed actor is numpy fp32 and must match this one: no TF32 (it
            # made them differ by 5.4e-4 on an H200); at these sizes tensor cores buy nothing.
            # The actor's LSTM also avoids cuDNN (see QLSTM.forward).
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        quant = cfg.quant == "on"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.actor = Actor(obs_dim, act_dim, cfg.hidden, quant, cfg.quant_bits, cfg.critic_obs)
            critic = dict(layer_norm=cfg.critic_layer_norm, layers=cfg.critic_head_layers,
                          width=cfg.critic_head_width)
            self.critic = Critic(obs_dim, act_dim, cfg.hidden, **critic)
            self.target = Critic(obs_dim, act_dim, cfg.hidden, **critic)
        self.target.load_state_dict(self.critic.state_dict())
        self.target.requires_grad_(False)
        # Eval mode: the target never backpropagates, and oneDNN's inference LSTM skips the
        # workspace the training one saves (measured 560 vs 820 us per pass at h=64).
        self.target.eval()
        for m in (self.actor, self.critic, self.target):
            m.to(device)
        # What the parameters are on, not what was asked for ("cuda" becomes "cuda:0"):
        # status reports this, so an operator sees where the learner really runs.
        self.device = next(self.actor.parameters()).device
        self.log_alpha = torch.full((), math.log(cfg.init_alpha), device=self.device, requires_grad=True)
        self.target_entropy = cfg.target_entropy_per_dim * act_dim
        # Three optimizers, as in SAC; foreach kernels cut per-parameter overhead.
        self.opt_actor = torch.optim.Adam(self.actor.parameters(), cfg.lr, fused=True)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), cfg.lr, fused=True)
        self.opt_alpha = torch.optim.Adam([self.log_alpha], cfg.lr, fused=True)
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed + 1)
        self.updates = 0
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.target.parameters())
        if not quant:
            for layer in self.actor.quant_layers():
                layer.phase.fill_(OFF)

    # --- the SAC update ------------------------------------------------------------
    def update(self, batch: SequenceBatch) -> dict[str, float]:
        cfg = self.cfg
        # Time-major (T, B, .) throughout: oneDNN's LSTM runs ~35% faster forward+backward
        # than batch-first, which transposes in and out (measured 1.76 vs 2.74 ms, h=64).
        t = {k: torch.as_tensor(v, device=self.device).transpose(0, 1).contiguous() if v.ndim > 1 else
             torch.as_tensor(v, device=self.device) for k, v in batch._asdict().items() if k != "prev_act0"}
        obs, act, mask = t["obs"], t["act"], t["mask"]
        prev_act0 = torch.as_tensor(batch.prev_act0, device=self.device)
        prev_act = torch.cat([prev_act0.unsqueeze(0), act], 0)  # (T+1, B, A)
        n = mask.sum().clamp(min=1.0)
        alpha = self.log_alpha.exp().detach()
        # The recurrent nets read (obs, prev_act) as sequences.  The memoryless control reads
        # every step as a sequence of its own, from a zero state and no previous action, exactly
        # as it acts; its next-step actions and values must not see the step before either.
        T1, B = obs.shape[:2]
        T = T1 - 1
        if cfg.memoryless:
            seq_obs, seq_prev = obs.reshape(1, T1 * B, -1), torch.zeros_like(prev_act).reshape(1, T1 * B, -1)
            crit_obs, crit_prev = seq_obs[:, : T * B], seq_prev[:, : T * B]
        else:
            seq_obs, seq_prev = obs, prev_act
            # The critic's values are needed at steps 0..T-1 only; step T (the next obs)
            # matters to the actor and the target alone.
            crit_obs, crit_prev = obs[:-1], prev_act[:-1]

        def steps(x: torch.Tensor) -> torch.Tensor:  # back to (T+1, B, .)
            return x.reshape(T1, B, x.shape[-1])

        # Actor over the whole window: its actions at t serve the actor loss, at t+1
        # the critic target.  Noise comes from the learner's own generator.
        mu, log_std, _ = self.actor(seq_obs, seq_prev)
        mu, log_std = steps(mu), steps(log_std)
        eps = torch.randn(mu.shape, generator=self.gen, device=self.device)
        u = mu + log_std.exp() * eps
        a_pi, logp = torch.tanh(u), tanh_log_prob(u, mu, log_std)

        # Critic: the recurrent core runs once; its output feeds both losses.  A critic without
        # memory reads each step alone; the windows, and so n-step returns, stay as they are.
        memory = cfg.critic_memory
        hw = self.critic.head_input(self.critic.core(crit_obs, crit_prev, memory))
        with torch.no_grad():
            h_targ = steps(self.target.core(seq_obs, seq_prev, memory))
            hw_targ = self.target.head_input(h_targ[1:])
            q_next = self.target.heads(hw_targ, a_pi[1:].detach()).min(0).values
            v_next = q_next - alpha * logp[1:]
            # Bootstrap through truncation, never through termination.
            y = n_step_targets(t["rew"], t["terminated"], t["truncated"], t["valid"], v_next, cfg.gamma,
                               1 if cfg.memoryless else cfg.n_step)
        q = self.critic.heads(hw, act)
        critic_loss = (((q - y) ** 2) * mask).sum() / n

        q_pi = self.critic.heads(hw, a_pi[:-1], detach_params=True).min(0).values
        logp_t = logp[:-1]
        actor_loss = ((alpha * logp_t - q_pi) * mask).sum() / n
        alpha_loss = -(self.log_alpha * ((logp_t.detach() + self.target_entropy) * mask)).sum() / n

        # The three losses touch disjoint parameters, so one backward serves them all.
        for opt in (self.opt_actor, self.opt_critic, self.opt_alpha):
            opt.zero_grad(set_to_none=True)
        (critic_loss + actor_loss + alpha_loss).backward()
        gn_actor = nn.utils.get_total_norm([p.grad for p in self.actor.parameters()
                                            if p.grad is not None], foreach=True)
        gn_critic = nn.utils.get_total_norm([p.grad for p in self._critic_params], foreach=True)
        self.opt_critic.step()
        self.opt_actor.step()
        self.opt_alpha.step()
        with torch.no_grad():
            torch._foreach_lerp_(self._target_params, self._critic_params, cfg.tau)

        self.updates += 1
        if self.updates >= cfg.calib_updates and self.quant_phase == "calibrating":
            self._finish_calibration()
        with torch.no_grad():
            q_mean = (q.mean(0) * mask).sum() / n
            entropy = -(logp_t * mask).sum() / n
            vals = torch.stack([critic_loss.detach(), actor_loss.detach(), alpha_loss.detach(),
                                alpha, q_mean, entropy, gn_actor, gn_critic]).tolist()
        keys = ("critic_loss", "actor_loss", "alpha_loss", "alpha", "q_mean", "entropy",
                "grad_norm_actor", "grad_norm_critic")
        return dict(zip(keys, vals))

    # --- quantization phase --------------------------------------------------------
    def _finish_calibration(self) -> None:
        for layer in self.actor.quant_layers():
            layer.finish_calibration()

    @property
    def quant_phase(self) -> str:
        return PHASE_NAMES[int(self.actor.fc1.phase)]

    # --- export of the deployable actor ---------------------------------------------
    @torch.no_grad()
    def export_actor(self) -> dict[str, np.ndarray]:
        """Plain arrays for :mod:`sacbot.acting.policy`.  Quantized layers give integer weights
        (int8 for bits <= 8) and float32 scales; otherwise float32 weights."""
        a = self.actor
        out: dict[str, np.ndarray] = {
            "meta.sizes": np.array([self.obs_dim, self.act_dim, self.cfg.hidden, FC_HIDDEN], np.int64),
            "meta.quantized": np.array(self.quant_phase == "training"),
            "meta.bits": np.array(self.cfg.quant_bits, np.int64),
        }
        for name, layer in (("fc1", a.fc1), ("lstm", a.lstm), ("fc2", a.fc2), ("head", a.head)):
            quantized = int(layer.phase) == QUANTIZING
            if quantized:
                assert layer.xq is not None
                sx = layer.xq.scale()
                out[f"{name}.x_scale"] = _np(sx)
                out[f"{name}.x_range"] = np.array([-layer.xq.qn, layer.xq.qp], np.int64)
            for wname, wq, w in _weights(name, layer):
                if quantized:
                    s = wq.scale()
                    out[f"{name}.{wname}"] = _np(wq.integer(w, s)).astype(np.int8)
                    out[f"{name}.{wname}_scale"] = _np(s.view(-1))
                else:
                    out[f"{name}.{wname}"] = _np(w)
            for bname, b in _biases(name, layer):
                out[f"{name}.{bname}"] = _np(b)
        return out

    # --- learner state: named plain arrays + JSON-able scalars, never pickle ----------
    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays: dict[str, np.ndarray] = {}
        for prefix, mod in (("actor", self.actor), ("critic", self.critic), ("target", self.target)):
            for k, v in mod.state_dict().items():
                arrays[f"{prefix}.{k}"] = _np(v)
        arrays["log_alpha"] = _np(self.log_alpha)
        for oname, opt, params in self._optimizers():
            for i, p in enumerate(params):
                st = opt.state.get(p, {})
                arrays[f"opt.{oname}.{i}.step"] = np.array(float(st["step"]) if st else 0.0, np.float32)
                zeros = np.zeros(tuple(p.shape), np.float32)
                arrays[f"opt.{oname}.{i}.exp_avg"] = _np(st["exp_avg"]) if st else zeros
                arrays[f"opt.{oname}.{i}.exp_avg_sq"] = _np(st["exp_avg_sq"]) if st else zeros
        arrays["rng.torch"] = _np(self.gen.get_state())
        meta = {"updates": self.updates, "quant_phase": self.quant_phase,
                "obs_dim": self.obs_dim, "act_dim": self.act_dim}
        return arrays, meta

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        if (meta["obs_dim"], meta["act_dim"]) != (self.obs_dim, self.act_dim):
            raise ValueError(f"saved learner has obs/act dims {meta['obs_dim']}/{meta['act_dim']}, "
                             f"this one {self.obs_dim}/{self.act_dim}")
        for prefix, mod in (("actor", self.actor), ("critic", self.critic), ("target", self.target)):
            sd = mod.state_dict()
            if prefix != "actor":  # deeper saved heads would otherwise load as a shallower critic, silently
                extra = sorted(k for k in arrays if k.startswith(prefix + ".") and k[len(prefix) + 1:] not in sd)
                missing = sorted(f"{prefix}.{k}" for k in sd if f"{prefix}.{k}" not in arrays)
                why = "(its Q heads were built with another critic_layer_norm or critic_head_layers)"
                if extra:
                    raise ValueError(f"saved learner has {prefix} parameters this one lacks: "
                                     f"{', '.join(extra[:4])} {why}")
                if missing:
                    raise ValueError(f"saved learner lacks {prefix} parameters this one has: "
                                     f"{', '.join(missing[:4])} {why}")
            new = {}
            for k, v in sd.items():
                a = arrays[f"{prefix}.{k}"]
                if tuple(a.shape) != tuple(v.shape):
                    raise ValueError(f"{prefix}.{k}: saved shape {a.shape}, expected {tuple(v.shape)}")
                new[k] = torch.as_tensor(np.array(a), dtype=v.dtype)
            mod.load_state_dict(new)
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(arrays["log_alpha"]))
        for oname, opt, params in self._optimizers():
            opt.state.clear()
            for i, p in enumerate(params):
                step = float(arrays[f"opt.{oname}.{i}.step"])
                if step > 0:
                    opt.state[p] = {
                        # Fused Adam keeps its step count on the parameter's device.
                        "step": torch.tensor(step, dtype=torch.float32, device=p.device),
                        "exp_avg": torch.as_tensor(np.array(arrays[f"opt.{oname}.{i}.exp_avg"])).to(p),
                        "exp_avg_sq": torch.as_tensor(np.array(arrays[f"opt.{oname}.{i}.exp_avg_sq"])).to(p),
                    }
        rng = torch.as_tensor(np.array(arrays["rng.torch"]), dtype=torch.uint8)
        if rng.numel() == self.gen.get_state().numel():
            self.gen.set_state(rng)
        else:
            # A CPU generator's state (mt19937) does not fit a CUDA one (seed and offset), so a
            # learner resumed on another kind of device draws other noise from here on.
            # Reseed from the seed and the update count, so that resuming stays reproducible.
            self.gen.manual_seed(self.cfg.seed + 1 + int(meta["updates"]))
            logging.getLogger("sacbot").warning(
                "the saved action-noise generator is for another kind of device than %s; reseeded it, so "
                "this run's noise differs from the saved run's", self.device)
        self.updates = int(meta["updates"])

    def _optimizers(self):
        return (("actor", self.opt_actor, list(self.actor.parameters())),
                ("critic", self.opt_critic, self._critic_params),
                ("alpha", self.opt_alpha, [self.log_alpha]))



def resolve_device(name: str) -> torch.device:
    """The torch device for ``--device``, or a ConfigError that says what is wrong."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        # torch takes "cpu:5" and runs on the one CPU device: a number there selects nothing
        raise ConfigError(f"device = {name!r} is not accepted: expected cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device = {name!r}, but this torch build ({torch.__version__}) sees no CUDA "
                              "GPU; use --device cpu or install a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device = {name!r}, but only {torch.cuda.device_count()} CUDA device(s) "
                              f"are visible (cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return dev


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def _weights(name, layer):
    if name == "lstm":
        return [("w_ih", getattr(layer, "wq_ih", None), layer.weight_ih),
                ("w_hh", getattr(layer, "wq_hh", None), layer.weight_hh)]
    return [("w", layer.wq, layer.weight)]


def _biases(name, layer):
    if name == "lstm":
        return [("b_ih", layer.bias_ih), ("b_hh", layer.bias_hh)]
    return [("b", layer.bias)]


# --- guards: a learner whose values went non-finite is never published or saved ---------------
class NonFiniteError(RuntimeError):
    """The learner produced NaN/inf (a loss, a gradient norm or a weight).  Its state is
    poisoned: nothing of it may be published or saved.  The last published weights and the
    last checkpoint stay as they were; the training thread stops."""


def non_finite(arrays: dict[str, np.ndarray]) -> list[str]:
    """Names of the float arrays that hold NaN or inf."""
    return [k for k, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]


def check_finite(arrays: dict[str, np.ndarray], what: str) -> None:
    bad = non_finite(arrays)
    if bad:
        raise NonFiniteError(f"{what}: non-finite values in {', '.join(bad[:5])}"
                             + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))

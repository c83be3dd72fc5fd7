"""Sequence replay: a preallocated numpy ring buffer sampled as fixed-length windows.

Usage::

    buf = SequenceReplay(capacity=100_000, obs_dim=3, act_dim=1)
    buf.add(obs, act, rew, next_obs, terminated, truncated)   # per transition
    if buf.can_sample(batch=16, seq_len=32):
        batch = buf.sample(16, 32, rng)                       # a SequenceBatch

Every transition carries an episode id.  A sampled window starts at a uniformly
chosen transition and runs forward for ``seq_len`` steps, stopping at its episode's
end (or at the newest transition): the rest is zero-padded with ``mask == 0``, so
no sequence ever crosses an episode boundary.  ``terminated`` and ``truncated`` are
kept apart because only termination stops bootstrapping (SB3 keeps ``timeouts``
for the same reason).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_ARRAYS = ("obs", "next_obs", "act", "rew", "terminated", "truncated", "episode")
# Checkpoints store the buffer in row chunks, each with a generation that every write bumps,
# so a periodic save re-encodes only the chunks written since the last one (docs/operations.md).
CHUNK_MIN_ROWS = 2048
MAX_CHUNKS = 64


class SequenceBatch(NamedTuple):
    """B windows of T = burn_in + seq_len steps.  Invalid (padded) entries are zero.

    obs[:, t + 1] is the observation after step t, so ``obs`` has T + 1 entries.
    ``prev_act0`` is the action taken just before the window (zeros at an episode
    start), so the previous-action input of every step is known.
    """

    obs: np.ndarray  # (B, T + 1, obs_dim) float32
    act: np.ndarray  # (B, T, act_dim) float32
    prev_act0: np.ndarray  # (B, act_dim) float32
    rew: np.ndarray  # (B, T) float32
    terminated: np.ndarray  # (B, T) float32
    truncated: np.ndarray  # (B, T) float32
    valid: np.ndarray  # (B, T) float32: a real transition (burn-in included)
    mask: np.ndarray  # (B, T) float32: a transition that counts in the losses


class SequenceReplay:
    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity, self.obs_dim, self.act_dim = capacity, obs_dim, act_dim
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.act = np.zeros((capacity, act_dim), np.float32)
        self.rew = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, np.bool_)
        self.truncated = np.zeros(capacity, np.bool_)
        self.episode = np.full(capacity, -1, np.int64)
        self.head = 0  # next write position
        self.size = 0
        self.current_episode = 0
        self._episode_open = False  # a transition of current_episode is stored
        self.chunk_rows = max(CHUNK_MIN_ROWS, -(-capacity // MAX_CHUNKS))
        self.chunk_gen = np.zeros(-(-capacity // self.chunk_rows), np.int64)

    def __len__(self) -> int:
        return self.size

    def start_episode(self) -> None:
        """Begin a new episode; the next transition will not be chained to the last."""
        if self._episode_open:
            self.current_episode += 1
            self._episode_open = False

    def add(self, obs, act, rew, next_obs, terminated: bool, truncated: bool) -> None:
        i = self.head
        self.obs[i], self.act[i], self.rew[i], self.next_obs[i] = obs, act, rew, next_obs
        self.terminated[i], self.truncated[i] = terminated, truncated
        self.episode[i] = self.current_episode
        self.chunk_gen[i // self.chunk_rows] += 1
        self._episode_open = True
        self.head = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        if terminated or truncated:
            self.start_episode()

    def clear(self) -> None:
        self.episode.fill(-1)
        self.chunk_gen += 1
        self.head = self.size = 0
        self.start_episode()

    def can_sample(self, batch: int, seq_len: int) -> bool:
        # Padding makes any stored step a valid window start; asking for at least
        # `batch` transitions lets the B windows start at distinct places.
        return batch >= 1 and seq_len >= 1 and self.size >= batch

    def sample(self, batch: int, seq_len: int, rng: np.random.Generator,
               burn_in: int = 0) -> SequenceBatch:
        """Sample ``batch`` windows of ``burn_in + seq_len`` steps.

        With burn-in, each window reaches back up to ``burn_in`` steps inside its
        episode; those steps warm the recurrent state and have ``mask == 0``.
        """
        if not self.can_sample(batch, seq_len):
            raise ValueError(f"cannot sample {batch}x{seq_len} from a buffer of {self.size}")
        n, cap = self.size, self.capacity
        oldest = (self.head - n) % cap
        # Starts by age (0 = oldest), so windows never run past the newest transition.
        age = rng.integers(0, n, size=batch)
        start = (oldest + age) % cap
        ep = self.episode[start]

        back = np.zeros(batch, np.int64)
        if burn_in > 0:
            k = np.arange(1, burn_in + 1)
            prev_idx = (start[:, None] - k) % cap
            ok = (self.episode[prev_idx] == ep[:, None]) & (k[None, :] <= age[:, None])
            back = np.cumprod(ok, axis=1).sum(axis=1)
        first = start - back  # may be negative before the modulo below
        T = burn_in + seq_len
        steps = np.arange(T)
        idx = (first[:, None] + steps) % cap
        in_store = steps[None, :] < (n - (age - back))[:, None]
        valid = np.cumprod((self.episode[idx] == ep[:, None]) & in_store, axis=1).astype(bool)
        mask = valid & (steps[None, :] >= back[:, None]) & (steps[None, :] < (back + seq_len)[:, None])

        vf = valid.astype(np.float32)
        obs = np.zeros((batch, T + 1, self.obs_dim), np.float32)
        obs[:, 0] = self.obs[first % cap]
        obs[:, 1:] = self.next_obs[idx] * vf[..., None]
        prev_idx0 = (first - 1) % cap
        has_prev = (self.episode[prev_idx0] == ep) & (age - back > 0)
        prev_act0 = self.act[prev_idx0] * has_prev[:, None]
        return SequenceBatch(
            obs=obs,
            act=self.act[idx] * vf[..., None],
            prev_act0=prev_act0.astype(np.float32),
            rew=self.rew[idx] * vf,
            terminated=self.terminated[idx] * vf,
            truncated=self.truncated[idx] * vf,
            valid=vf,
            mask=mask.astype(np.float32),
        )

    # -- plain-array export for checkpoints (positions preserved, so a resumed run
    # samples exactly what an uninterrupted one would) --------------------------------
    def export(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {f"replay.{k}": getattr(self, k)[:self._stored()].copy() for k in _ARRAYS}
        return arrays, self._meta()

    def export_chunks(self, since: dict[int, int] | None = None) -> tuple[list[dict], dict]:
        """The buffer as row chunks ``{"index", "gen", "arrays"}`` (copies), leaving out each chunk
        whose generation equals ``since[index]`` (the writer already holds it).  ``meta["chunk_gens"]``
        lists the generation of every stored chunk, so the writer can check it has them all."""
        stored, c = self._stored(), self.chunk_rows
        n = -(-stored // c)
        since = since or {}
        chunks = [{"index": k, "gen": int(self.chunk_gen[k]),
                   "arrays": {f"replay.{a}": getattr(self, a)[k * c:min((k + 1) * c, stored)].copy()
                              for a in _ARRAYS}}
                  for k in range(n) if since.get(k) != int(self.chunk_gen[k])]
        meta = self._meta()
        meta.update(chunk_rows=c, chunk_gens=[int(g) for g in self.chunk_gen[:n]])
        return chunks, meta

    def _stored(self) -> int:
        return self.capacity if self.size == self.capacity else self.head

    def _meta(self) -> dict:
        return {"capacity": self.capacity, "head": self.head, "size": self.size,
                "current_episode": self.current_episode, "episode_open": self._episode_open}

    def load(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Restore an exported buffer.  At the same capacity the rows keep their positions (a
        resumed run samples what an uninterrupted one would); at another capacity the rows are
        laid out oldest first and, if they do not fit, only the newest are kept."""
        saved_cap, head, size = int(meta["capacity"]), int(meta["head"]), int(meta["size"])
        stored = saved_cap if size == saved_cap else head
        if not (0 <= size <= saved_cap and 0 <= head < max(saved_cap, 1) and size in (head, saved_cap)):
            raise ValueError(f"replay meta is inconsistent: capacity {saved_cap}, head {head}, size {size}")
        self.clear()
        if saved_cap == self.capacity:
            order = np.arange(stored)
            self.head, self.size = head, size
        else:
            oldest = (head - size) % saved_cap if size == saved_cap else 0
            keep = min(size, self.capacity)
            order = (oldest + np.arange(size - keep, size)) % saved_cap
            self.head, self.size = keep % self.capacity, keep
        for k in _ARRAYS:
            if stored == 0 and f"replay.{k}" not in arrays:
                continue  # an empty buffer is saved as no chunks at all
            a = arrays[f"replay.{k}"]
            dst = getattr(self, k)
            if a.shape[1:] != dst.shape[1:] or len(a) != stored:
                raise ValueError(f"replay.{k} has shape {a.shape}, expected ({stored}, *{dst.shape[1:]})")
            dst[: len(order)] = a[order]
        self.current_episode = int(meta["current_episode"])
        self._episode_open = bool(meta["episode_open"])
        self.chunk_gen += 1

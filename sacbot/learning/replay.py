"""Sequence replay: a preallocated numpy ring buffer sampled as fixed-length windows.

Usage::

    buf = SequenceReplay(capacity=100_000, obs_dim=3, act_dim=1)
    buf.add(obs, act, rew, next_obs, terminated, truncated)   # per transition (source 0)
    buf.add(obs, act, rew, next_obs, False, False, source=7)  # another bot's stream
    buf.add_batch(obs_n, act_n, rew_n, next_obs_n, term_n, trunc_n, source=7)  # n of them as columns
    if buf.can_sample(batch=16, seq_len=32):
        batch = buf.sample(16, 32, rng)                       # a SequenceBatch

Many sources (bots) share one ring: one capacity, the oldest row overwritten first whoever
wrote it.  Their rows interleave in the ring, so an episode is not a run of neighbouring rows
but a chain: every row holds its ``source``, a global ``episode`` id (one counter for all
sources, so ids never repeat) and ``prev``/``next`` links to the rows before and after it in its
episode (-1 at the ends).  A sampled window starts at a uniformly chosen row and follows
``next`` for ``seq_len`` steps, stopping at its episode's end (or its source's newest row): the
rest is zero-padded with ``mask == 0``, so no sequence ever crosses an episode or a source.
``terminated`` and ``truncated`` are kept apart because only termination stops bootstrapping
(SB3 keeps ``timeouts`` for the same reason).

Why the links need no write stamp: rows are overwritten strictly in write order, so a row's
successor (written after it) outlives it, and a ``next`` link from a stored row always holds.
A ``prev`` link can outlive its target; overwriting a row therefore unlinks its successor's
``prev`` (one write).  Row ``capacity`` is a sentinel (zero data, episode -1, links -1), which
index -1 reaches, so following a link past an end stays at the end and reads zeros.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np

_DATA = ("obs", "next_obs", "act", "rew", "terminated", "truncated", "episode")
_LINKS = ("source", "prev", "next")  # absent from checkpoints older than many-source replay
_ARRAYS = _DATA + _LINKS
# Checkpoints store the buffer in row chunks, each with a generation that every write bumps,
# so a periodic save re-encodes only the chunks written since the last one (docs/design.md, "Checkpoints").
CHUNK_MIN_ROWS = 2048
MAX_CHUNKS = 64
# A window start is drawn over all stored rows and redrawn where it hit a cleared one; what is
# left after a few rounds (about B * (cleared share)^5 starts) is drawn from a list of the held
# rows, built in O(capacity) and kept until the next write.  Measured on a full 100k ring with
# 50%, 25% and 0.1% of it held: sample(16, 32) 83-85 us, 123 us with the list rebuilt each time.
_REDRAWS = 4


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
        rows = capacity + 1  # the last row is the sentinel that index -1 reaches
        self.obs = np.zeros((rows, obs_dim), np.float32)
        self.next_obs = np.zeros((rows, obs_dim), np.float32)
        self.act = np.zeros((rows, act_dim), np.float32)
        self.rew = np.zeros(rows, np.float32)
        self.terminated = np.zeros(rows, np.bool_)
        self.truncated = np.zeros(rows, np.bool_)
        self.episode = np.full(rows, -1, np.int64)  # -1: no transition (never written, or cleared)
        self.source = np.zeros(rows, np.int32)
        self.prev = np.full(rows, -1, np.int32)  # row of the step before, in this episode
        self.next = np.full(rows, -1, np.int32)  # row of the step after, in this episode
        self.head = 0  # next write position
        self.size = 0  # rows the ring has filled (cleared ones included)
        self.n_valid = 0  # rows holding a transition: len(buffer)
        self.next_episode = 0  # the id the next episode of any source gets
        self.open: dict[int, list[int]] = {}  # source -> [its open episode, its newest row]
        self._held: np.ndarray | None = None  # rows holding data, while some are cleared
        self.chunk_rows = max(CHUNK_MIN_ROWS, -(-capacity // MAX_CHUNKS))
        self.chunk_gen = np.zeros(-(-capacity // self.chunk_rows), np.int64)

    def __len__(self) -> int:
        return self.n_valid

    def start_episode(self, source: int = 0) -> None:
        """Begin a new episode of ``source``; its next transition will not be chained to the last."""
        self.open.pop(source, None)

    def add(self, obs, act, rew, next_obs, terminated: bool, truncated: bool, source: int = 0) -> None:
        """Store one transition of ``source`` (a bot's id, 0 <= source < 2**31)."""
        source = operator.index(source)  # a plain int: it goes into the checkpoint's meta
        if not 0 <= source < 2**31:
            raise ValueError(f"replay source must be an int in [0, 2**31), got {source!r}")
        i = self.head
        st = self.open.get(source)
        if st is None:
            st = self.open[source] = [self.next_episode, -1]
            self.next_episode += 1
        ep, last = st
        # Decided before row i is overwritten: it may be this source's newest row.
        link = last if last != i and self.episode[last] == ep else -1
        rows, chunk = self.chunk_rows, i // self.chunk_rows
        if self.episode[i] >= 0:  # the oldest row leaves: its successor loses its predecessor
            succ = int(self.next[i])
            if succ >= 0:
                self.prev[succ] = -1
                if succ // rows != chunk:
                    self.chunk_gen[succ // rows] += 1
            self.n_valid -= 1
        self.obs[i], self.act[i], self.rew[i], self.next_obs[i] = obs, act, rew, next_obs
        self.terminated[i], self.truncated[i] = terminated, truncated
        self.episode[i], self.source[i], self.prev[i], self.next[i] = ep, source, link, -1
        self.chunk_gen[chunk] += 1
        if link >= 0:  # linking writes the previous row too: its chunk must be saved again
            self.next[link] = i
            if link // rows != chunk:
                self.chunk_gen[link // rows] += 1
        st[1] = i
        self.n_valid += 1
        self._held = None
        self.head = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        if terminated or truncated:
            self.open.pop(source, None)

    def add_batch(self, obs, act, rew, next_obs, terminated, truncated, source: int = 0) -> None:
        """Store ``len(rew)`` consecutive transitions of ``source`` (columns, oldest first) with one
        numpy write per array: the same rows, links and episodes as that many ``add`` calls, at a
        fraction of their Python cost (a learner fed by hundreds of bots spends its time here)."""
        n = len(rew)
        if n < 2 or n >= self.capacity:  # nothing to gain, or the block would overwrite itself
            for k in range(n):
                self.add(obs[k], act[k], rew[k], next_obs[k], bool(terminated[k]), bool(truncated[k]), source)
            return
        source = operator.index(source)
        if not 0 <= source < 2**31:
            raise ValueError(f"replay source must be an int in [0, 2**31), got {source!r}")
        cap, head = self.capacity, self.head
        idx = (head + np.arange(n)) % cap
        done = np.asarray(terminated, np.bool_) | np.asarray(truncated, np.bool_)
        seg = np.zeros(n, np.int64)  # which of the block's episodes each row is in: a new one after a done row
        np.cumsum(done[:-1], out=seg[1:])
        st = self.open.get(source)
        link0 = -1
        if st is None:
            ep = self.next_episode + seg
            self.next_episode += int(seg[-1]) + 1
        else:
            ep0, last = st
            # As in add(): the source's newest row links to the first, unless this block overwrites
            # it (add() would unlink the first row again when it reached that row).
            if (last - head) % cap >= n and self.episode[last] == ep0:
                link0 = last
            ep = np.where(seg == 0, ep0, self.next_episode + seg - 1)
            self.next_episode += int(seg[-1])
        touched = [idx]
        old = idx[self.episode[idx] >= 0]
        if len(old):  # the oldest rows leave: their successors lose their predecessors
            succ = self.next[old]
            succ = succ[succ >= 0]
            self.prev[succ] = -1
            touched.append(succ)
            self.n_valid -= len(old)
        self.obs[idx], self.act[idx], self.rew[idx], self.next_obs[idx] = obs, act, rew, next_obs
        self.terminated[idx], self.truncated[idx] = terminated, truncated
        self.episode[idx], self.source[idx] = ep, source
        same = seg[1:] == seg[:-1]  # row k continues row k - 1's episode
        prev = np.full(n, -1, np.int32)
        nxt = np.full(n, -1, np.int32)
        prev[1:][same] = idx[:-1][same]
        nxt[:-1][same] = idx[1:][same]
        prev[0] = link0
        self.prev[idx], self.next[idx] = prev, nxt
        if link0 >= 0:
            self.next[link0] = idx[0]
            touched.append(np.array([link0]))
        self.chunk_gen[np.unique(np.concatenate(touched) // self.chunk_rows)] += 1
        self.n_valid += n
        self._held = None
        self.head = (head + n) % cap
        self.size = min(self.size + n, cap)
        if done[-1]:
            self.open.pop(source, None)
        else:
            self.open[source] = [int(ep[-1]), int(idx[-1])]

    def clear(self, source: int | None = None) -> None:
        """Drop every transition (``source`` None), or only those of one source.  A source's
        cleared rows keep their places in the ring until overwritten but are never sampled."""
        cap = self.capacity
        self._held = None
        if source is not None:
            rows = (self.episode[:cap] >= 0) & (self.source[:cap] == source)
            n = int(np.count_nonzero(rows))
        if source is None or n == self.n_valid:  # nothing else left: reset the ring
            self.episode.fill(-1)
            self.prev.fill(-1)
            self.next.fill(-1)
            self.chunk_gen += 1
            self.head = self.size = self.n_valid = 0
            if source is None:
                self.open.clear()
            else:
                self.open.pop(source, None)
            return
        for a in (self.episode, self.prev, self.next):
            a[:cap][rows] = -1
        self.chunk_gen += np.logical_or.reduceat(rows, np.arange(0, cap, self.chunk_rows))
        self.n_valid -= n
        self.open.pop(source, None)

    def can_sample(self, batch: int, seq_len: int) -> bool:
        # Padding makes any stored step a valid window start; asking for at least
        # `batch` transitions lets the B windows start at distinct places.
        return batch >= 1 and seq_len >= 1 and self.n_valid >= batch

    def sample_indices(self, batch: int, seq_len: int, rng: np.random.Generator,
                       burn_in: int = 0) -> np.ndarray:
        """The (batch, burn_in + seq_len) rows that ``sample`` would gather, -1 where padded."""
        return self._windows(batch, seq_len, rng, burn_in)[0]

    def sample(self, batch: int, seq_len: int, rng: np.random.Generator,
               burn_in: int = 0) -> SequenceBatch:
        """Sample ``batch`` windows of ``burn_in + seq_len`` steps.

        With burn-in, each window reaches back up to ``burn_in`` steps inside its
        episode; those steps warm the recurrent state and have ``mask == 0``.
        """
        idx, back = self._windows(batch, seq_len, rng, burn_in)
        first = idx[:, 0]
        T = burn_in + seq_len
        steps = np.arange(T)
        valid = idx >= 0
        mask = valid & (steps >= back[:, None]) & (steps < (back + seq_len)[:, None])
        # Index -1 is the sentinel row of zeros: padding needs no multiplication.
        obs = np.empty((batch, T + 1, self.obs_dim), np.float32)
        obs[:, 0] = self.obs[first]
        obs[:, 1:] = self.next_obs[idx]
        return SequenceBatch(
            obs=obs,
            act=self.act[idx],
            prev_act0=self.act[self.prev[first]],  # the sentinel's zeros at an episode start
            rew=self.rew[idx],
            terminated=self.terminated[idx].astype(np.float32),
            truncated=self.truncated[idx].astype(np.float32),
            valid=valid.astype(np.float32),
            mask=mask.astype(np.float32),
        )

    def _windows(self, batch: int, seq_len: int, rng: np.random.Generator,
                 burn_in: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows (B, T), -1 padded; burn-in steps each window got (B,))."""
        if not self.can_sample(batch, seq_len):
            raise ValueError(f"cannot sample {batch}x{seq_len} from a buffer of {self.n_valid}")
        n, cap = self.size, self.capacity
        oldest = self.head - n
        start = (oldest + rng.integers(0, n, size=batch)) % cap
        if self.n_valid < n:  # some rows were cleared: uniform over the rows that hold data
            for _ in range(_REDRAWS):
                bad = np.flatnonzero(self.episode[start] < 0)
                if not len(bad):
                    break
                start[bad] = (oldest + rng.integers(0, n, size=len(bad))) % cap
            bad = np.flatnonzero(self.episode[start] < 0)
            if len(bad):  # few rows hold data: draw among them (the list is kept until a write)
                if self._held is None:
                    self._held = np.flatnonzero(self.episode[:cap] >= 0)
                start[bad] = self._held[rng.integers(0, len(self._held), size=len(bad))]
        # One small gather per step over the batch: links stay inside an episode, and -1 (the
        # sentinel) links to itself, so a window that reached its end stays there.
        back = np.zeros(batch, np.int64)
        first = start
        if burn_in > 0:
            walk = np.empty((burn_in + 1, batch), np.intp)
            walk[0] = start
            for k in range(burn_in):
                walk[k + 1] = self.prev[walk[k]]
            back = (walk[1:] >= 0).sum(axis=0)
            first = walk[back, np.arange(batch)]
        T = burn_in + seq_len
        rows = np.empty((T, batch), np.intp)
        rows[0] = first
        nxt = self.next
        for t in range(1, T):
            rows[t] = nxt[rows[t - 1]]
        return rows.T, back

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
        # Lists, not dicts keyed by source: checkpoint msgpack takes string keys only.
        return {"capacity": self.capacity, "head": self.head, "size": self.size,
                "next_episode": self.next_episode,
                "sources": [[s, ep, last] for s, (ep, last) in sorted(self.open.items())]}

    def load(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Restore an exported buffer.  At the same capacity the rows keep their positions (a
        resumed run samples what an uninterrupted one would); at another capacity the rows are
        laid out oldest first and, if they do not fit, only the newest are kept (links to rows
        left out become episode ends).  A buffer saved before many-source replay (no source or
        links) is one stream of source 0 whose episodes are runs of neighbouring rows."""
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
        saved = {}
        for k in _ARRAYS:
            name = f"replay.{k}"
            if name not in arrays and (stored == 0 or k in _LINKS):
                continue  # an empty buffer is saved as no chunks at all; links: built below
            a = arrays[name]
            dst = getattr(self, k)
            if a.shape[1:] != dst.shape[1:] or len(a) != stored:
                raise ValueError(f"{name} has shape {a.shape}, expected ({stored}, *{dst.shape[1:]})")
            saved[k] = a
        if stored and not all(k in saved for k in _LINKS):
            saved.update(_contiguous_links(saved["episode"], head, size, saved_cap))
        for k in ("prev", "next"):
            if stored and not ((saved[k] >= -1) & (saved[k] < stored)).all():
                raise ValueError(f"replay.{k} links to rows outside the {stored} stored")
        # Saved row -> new row (-1: left out); the extra last entry maps the end marker -1 to -1.
        new_row = np.full(stored + 1, -1, np.int64)
        new_row[order] = np.arange(len(order))
        for k, a in saved.items():
            getattr(self, k)[:len(order)] = new_row[a[order]] if k in ("prev", "next") else a[order]
        self.n_valid = int((self.episode[:self.capacity] >= 0).sum())
        if "sources" in meta:
            self.next_episode = int(meta["next_episode"])
            open_ = {int(s): (int(ep), int(last)) for s, ep, last in meta["sources"]}
        else:  # one stream: source 0's open episode ends at the newest row
            cur = int(meta["current_episode"])
            self.next_episode = cur + 1 if meta["episode_open"] else cur
            open_ = {0: (cur, (head - 1) % saved_cap)} if meta["episode_open"] and stored else {}
        for s, (ep, last) in open_.items():
            self.open[s] = [ep, int(new_row[last]) if -1 <= last < stored else -1]
        if self.n_valid:
            self.next_episode = max(self.next_episode, int(self.episode.max()) + 1)
        self.chunk_gen += 1


def _contiguous_links(episode: np.ndarray, head: int, size: int, cap: int) -> dict[str, np.ndarray]:
    """Source and links of a single-stream buffer, where an episode's rows are neighbours in
    write order (oldest first from ``head - size``)."""
    stored = len(episode)
    ring = (head - size + np.arange(size)) % cap
    ep = episode[ring]
    same = (ep[1:] == ep[:-1]) & (ep[1:] >= 0)
    prev = np.full(stored, -1, np.int32)
    nxt = np.full(stored, -1, np.int32)
    prev[ring[1:][same]] = ring[:-1][same]
    nxt[ring[:-1][same]] = ring[1:][same]
    return {"source": np.zeros(stored, np.int32), "prev": prev, "next": nxt}

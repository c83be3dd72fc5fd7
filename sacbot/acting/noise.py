"""Coloured exploration noise for the acting policy: numpy only, drawn ahead in chunks.

Usage::

    noise = ColoredNoise(beta=1.0, dim=act_dim, rng=np.random.default_rng(0))
    for episode in game:
        noise.restart()                                  # each episode draws a fresh sequence
        for tick in episode:
            action, state = act(params, obs, state, noise)   # noise.standard_normal(act_dim)

SAC explores by adding independent Gaussian draws, one per tick (white noise).  Averaged over a
few ticks they cancel, so a game that rewards a long push one way (MountainCar: rock back and
forth to climb) is never found by chance.  Noise with power spectrum ``1/f**beta`` keeps each
tick's draw a unit Gaussian but correlates it with its neighbours: ``beta`` 0 is white, 1 pink,
2 red (a random walk's).  Pink noise was found a good default across tasks for off-policy
continuous control (Eberhard et al., ICLR 2023, "Pink Noise Is All You Need"): it keeps some
of white noise's local jitter and some of red noise's drift.

A chunk of ``chunk`` ticks per action dimension is made at once with one inverse real FFT (a
Gaussian spectrum shaped by ``f**(-beta/2)``), and scaled so that each draw has unit variance
whatever ``beta``.  Frequencies below ``1/chunk`` are folded into the lowest one, so drift is
correlated over at most a chunk.  A chunk costs a fraction of a millisecond: it is made in
``restart()`` (called between episodes, by ``Agent.new_episode``) and when one runs out.
"""

from __future__ import annotations

import numpy as np

CHUNK = 1000  # ticks: a thousand-tick episode (MountainCar's 999) explores in one sequence


class ColoredNoise:
    """Unit Gaussian draws, one vector per tick, with a ``1/f**beta`` spectrum along time."""

    def __init__(self, beta: float, dim: int, rng: np.random.Generator, chunk: int = CHUNK):
        if not beta >= 0:
            raise ValueError(f"beta = {beta!r}: expected 0 (white) or more (1 pink, 2 red)")
        if dim < 1 or chunk < 2:
            raise ValueError(f"dim = {dim}, chunk = {chunk}: expected dim >= 1 and chunk >= 2")
        self.beta, self.dim, self.rng, self.chunk = float(beta), int(dim), rng, int(chunk)
        f = np.fft.rfftfreq(self.chunk)
        f[0] = f[1]  # the lowest frequency a chunk can hold stands in for everything below it
        self._scale = f ** (-self.beta / 2)
        # irfft's bin k > 0 (and below Nyquist) adds 2|X_k| cos(...) / n to every sample; the DC bin and,
        # for an even n, the Nyquist bin are real and are drawn with twice the variance (below): the sum
        # of the variances over n**2 is each sample's variance.
        s2 = self._scale**2
        edge = [0, -1] if self.chunk % 2 == 0 else [0]
        var = (4 * s2.sum() - 2 * s2[edge].sum()) / self.chunk**2
        self._norm = 1.0 / np.sqrt(var)
        self._buf = np.empty((0, self.dim), np.float32)
        self._i = 0
        self.last = np.zeros(self.dim, np.float32)  # the latest draw (the warm-up acts on it)

    def restart(self) -> None:
        """Start a fresh sequence (at an episode's start): the next draw opens a new chunk."""
        self._buf = self._make()
        self._i = 0

    def standard_normal(self, size: int) -> np.ndarray:
        """The next tick's draw, shape ``(dim,)``: called as a ``numpy.random.Generator`` would be."""
        if size != self.dim:
            raise ValueError(f"size = {size}: this noise draws {self.dim} values per tick")
        if self._i >= len(self._buf):
            self.restart()
        self.last = self._buf[self._i]
        self._i += 1
        return self.last

    def _make(self) -> np.ndarray:
        shape = (self.dim, len(self._scale))
        spec = self.rng.standard_normal(shape) + 1j * self.rng.standard_normal(shape)
        spec *= self._scale
        # Bins that must be real: their imaginary part is dropped and the real part doubled in variance.
        spec[:, 0] = spec[:, 0].real * np.sqrt(2)
        if self.chunk % 2 == 0:
            spec[:, -1] = spec[:, -1].real * np.sqrt(2)
        x = np.fft.irfft(spec, n=self.chunk, axis=1) * self._norm
        return np.ascontiguousarray(x.T, dtype=np.float32)

"""What an Agent reports of itself: act() latency in constant memory, and the eval summary.

    window = LatencyWindow(); window.add(ns); window.summary_us()   # {"act_p50_us": ..., ...}
    summary(agent)     # episodes, mean/std return, per-opponent results and win rates
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sacbot.acting.agent import Agent


class LatencyWindow:
    """act() latencies of one episode in constant memory: the last ``size`` ticks for the
    percentiles (an episode can last days at 30 ticks/s; a list grew ~37 B per tick), and the
    maximum over the whole episode."""

    def __init__(self, size: int = 4096):
        self._ns = np.zeros(size, np.int64)
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.max_ns = 0

    def add(self, ns: int) -> None:
        self._ns[self.count % len(self._ns)] = ns
        self.count += 1
        if ns > self.max_ns:
            self.max_ns = ns

    def summary_us(self) -> dict:
        if not self.count:
            return {}
        a = self._ns[:min(self.count, len(self._ns))] / 1e3
        return {"act_p50_us": round(float(np.percentile(a, 50)), 1),
                "act_p99_us": round(float(np.percentile(a, 99)), 1),
                "act_max_us": round(self.max_ns / 1e3, 1)}


def summary(agent: Agent) -> dict:
    """Eval summary: episodes, mean and std of return, per-opponent results (with the win rate
    when the env reports ``info["won"]``)."""
    allr = [r for rs in agent.results.values() for r in rs]
    per = {k: {"episodes": len(v), "mean_return": float(np.mean(v)), "std_return": float(np.std(v))}
           for k, v in agent.results.items()}
    for k, w in agent.wins.items():
        if w:
            per[k]["win_rate"] = float(np.mean(w))
    return {"episodes": len(allr), "mean_return": float(np.mean(allr)) if allr else None,
            "std_return": float(np.std(allr)) if allr else None, "per_opponent": per,
            "checkpoint": agent.loaded_from}

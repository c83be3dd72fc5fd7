"""The acting side: what runs every tick of a game, in numpy, and never waits.

* :mod:`~sacbot.acting.agent`: the :class:`~sacbot.acting.agent.Agent` loop (act, observe,
  new_episode, close), fed its start by the assembly;
* :mod:`~sacbot.acting.policy`: the actor as a pure function of its parameters and state;
* :mod:`~sacbot.acting.games`: gymnasium env helpers (make, flatten, the layout saved with a bot).

Imports: :mod:`sacbot.config`, :mod:`sacbot.wire`, :mod:`sacbot.store`; never the learning side,
the assembly or torch (import-linter contracts in pyproject.toml, checked in CI).
"""

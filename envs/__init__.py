"""Gymnasium environments shipped with sacbot; importing this module registers them.

=========================  ==========================================================
id                         what
=========================  ==========================================================
sacbot/TankDuel-v0         the partially observable tank duel (envs/tank_duel.py)
sacbot/TankDuelRadar-v0    the duel with only this tick's radar in the observation
sacbot/TankDuelRadar-v1    a 120-degree radar; the critic also sees the enemy; shaping
sacbot/TankDuelMemory-v0   v1 at v0's 40-degree radar: the duel where memory is needed
sacbot/CueMemory-v0        the smallest memory task (envs/memory.py)
sacbot/Pendulum-P-v0       Pendulum with only the angle observed
sacbot/Pendulum-V-v0       Pendulum with only the angular velocity observed
sacbot/<Task>-P/-V/-F-v0   Pendulum, MountainCarContinuous, LunarLanderContinuous and
                           InvertedDoublePendulum with positions only, velocities only,
                           or flickering observations (envs/pomdp.py)
=========================  ==========================================================
"""

import warnings

from gymnasium.envs.registration import register, registry

# gymnasium calls any id with a higher version "out of date", but TankDuelRadar-v0 is a task of its
# own (no critic values, no shaping, a 40-degree radar), not an old v1: the advice would mislead.
warnings.filterwarnings("ignore", message=r".*sacbot/TankDuelRadar-v0 is out of date", category=DeprecationWarning)


# Installed, this folder is the package ``sacbot.envs`` (pyproject.toml's package-dir: a
# top-level ``envs`` would clash with other projects'); entry points follow whatever name
# this module was imported under.
def _register(id_, **kw):
    if id_ not in registry:
        register(id=id_, **kw)


# TankDuel truncates itself at max_ticks (a kwarg), so no TimeLimit.  Its registered default
# is the easiest duel, against sitting_duck, with the gun aimed relative to the last-seen
# bearing (gun_control="aim"), so `sacbot run` shows learning out of the box; other opponents,
# schedules and the raw gun turn come through kwargs (--env-kwargs).
_register("sacbot/TankDuel-v0", entry_point=f"{__name__}.tank_duel:TankDuel",
          kwargs={"opponents": ("sitting_duck",), "schedule": "fixed", "gun_control": "aim"})
# The duel that leaves memory to the player: only what the radar sees this tick, the gun turned
# directly (what memory buys in it: tools/bench/radar_bounds.py).
_register("sacbot/TankDuelRadar-v0", entry_point=f"{__name__}.tank_duel:TankDuel",
          kwargs={"opponents": ("sitting_duck",), "schedule": "fixed", "gun_control": "turn",
                  "observation": "radar"})
# The radar duel made learnable (docs/experiments.md): the observation ends in 14 values
# for the critic alone (the enemy's true state; sacbot never gives them to the actor), and
# potential-based shaping pays a shot on course when it is fired and the gun's turn towards the
# enemy.  Neither alone taught the learner the duel; together they did with a 120-degree radar (the
# enemy in view one tick in three).  At v0's 40 degrees the same learner reached 15-30% in 30k.
# Its preset (sacbot/config/presets.py) also gives it a critic without memory, which the critic's values
# make possible: with it every run measured learnt the duel (docs/experiments.md).
_register("sacbot/TankDuelRadar-v1", entry_point=f"{__name__}.tank_duel:TankDuel",
          kwargs={"opponents": ("sitting_duck",), "schedule": "fixed", "gun_control": "turn",
                  "observation": "radar", "radar_arc": 120.0, "critic_info": True, "shaping": True})
# The duel where memory is needed, to measure what it buys: v1's aids (critic-only enemy state, shaping) at v0's
# 40-degree radar, so the radar's sweep holds the enemy a third as often as v1's.  tools/bench/radar_bounds.py
# measures what that does: a memoryless policy that fires on a sighting still wins v1 (120 degrees)
# 100% under a learner's gun noise, but at 40 degrees it wins 22-54% against sitting_duck and 2-10%
# against tracker, while one that remembers the last sighting wins 100% (docs/experiments.md).
# A name of its own, not TankDuelRadar-v2: gymnasium would then call v1 out of date
# and play v2 for an unversioned "sacbot/TankDuelRadar", and v1 is not superseded, it is easier.
_register("sacbot/TankDuelMemory-v0", entry_point=f"{__name__}.tank_duel:TankDuel",
          kwargs={"opponents": ("sitting_duck",), "schedule": "fixed", "gun_control": "turn",
                  "observation": "radar", "radar_arc": 40.0, "critic_info": True, "shaping": True})
_register("sacbot/CueMemory-v0", entry_point=f"{__name__}.memory:CueMemory", max_episode_steps=50)
_register("sacbot/Pendulum-P-v0", entry_point=f"{__name__}.pomdp:pendulum_p", max_episode_steps=200)
_register("sacbot/Pendulum-V-v0", entry_point=f"{__name__}.pomdp:pendulum_v", max_episode_steps=200)
# Every task of pomdp.VIEWS, partially observed three ways (Pendulum's P and V above keep their ids'
# own TimeLimit; these take their task's from gym.make inside).
for _task in ("Pendulum-v1", "MountainCarContinuous-v0", "LunarLanderContinuous-v3", "InvertedDoublePendulum-v5"):
    for _view in ("P", "V", "F"):
        _id = f"sacbot/{_task.rsplit('-', 1)[0]}-{_view}-v0"
        if _id not in ("sacbot/Pendulum-P-v0", "sacbot/Pendulum-V-v0"):
            _register(_id, entry_point=f"{__name__}.pomdp:partially_observed", kwargs={"task": _task, "view": _view})

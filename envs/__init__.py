"""Gymnasium environments shipped with sacbot; importing this module registers them.

=========================  ==========================================================
id                         what
=========================  ==========================================================
sacbot/TankDuel-v0         the partially observable tank duel (envs/tank_duel.py)
sacbot/CueMemory-v0        the smallest memory task (envs/memory.py)
sacbot/Pendulum-P-v0       Pendulum with only the angle observed
sacbot/Pendulum-V-v0       Pendulum with only the angular velocity observed
=========================  ==========================================================
"""

from gymnasium.envs.registration import register, registry


def _register(id_, **kw):
    if id_ not in registry:
        register(id=id_, **kw)


# TankDuel truncates itself at max_ticks (a kwarg), so no TimeLimit.  Its registered default
# is the easiest duel, against sitting_duck, with the gun aimed relative to the last-seen
# bearing (gun_control="aim"), so `sacbot run` shows learning out of the box; other opponents,
# schedules and the raw gun turn come through kwargs (--env-kwargs).
_register("sacbot/TankDuel-v0", entry_point="envs.tank_duel:TankDuel",
          kwargs={"opponents": ("sitting_duck",), "schedule": "fixed", "gun_control": "aim"})
_register("sacbot/CueMemory-v0", entry_point="envs.memory:CueMemory", max_episode_steps=50)
_register("sacbot/Pendulum-P-v0", entry_point="envs.pomdp:pendulum_p", max_episode_steps=200)
_register("sacbot/Pendulum-V-v0", entry_point="envs.pomdp:pendulum_v", max_episode_steps=200)

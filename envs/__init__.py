"""Gymnasium environments shipped with sacbot; importing this module registers them."""

from gymnasium.envs.registration import register, registry

if "sacbot/CueMemory-v0" not in registry:
    register(id="sacbot/CueMemory-v0", entry_point="envs.memory:CueMemory", max_episode_steps=50)

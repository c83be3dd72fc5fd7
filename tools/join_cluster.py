"""An external game process that joins a running sacbot cluster and feeds its learner.

Start a cluster that other processes can join (a Ray head, then sacbot's learner and bots on it)::

    ray start --head --num-cpus 4                    # prints the address, e.g. 10.0.0.5:6379
    sacbot cluster --address auto --bots 2           # the learner and two bots on that cluster

Then, from the game's own process (any machine that reaches the head)::

    python tools/join_cluster.py --address auto --source 100 --episodes 5

Ray 2.59 and later protect a cluster with a token: a joining process needs ``RAY_AUTH_MODE=token``
and the token (``~/.ray/auth_token`` on the head's machine, or ``RAY_AUTH_TOKEN``); this script sets
the mode when the environment has not.

The game plays its own loop with the numpy Agent; the Agent's learner is the cluster's Ray actor
(``sacbot-learner`` in namespace ``sacbot``), reached through the same boundary a local learner
has.  The source id must differ from every other bot's (cluster bots use 0..N-1), so the
learner keeps this game's experience apart from theirs.  Sends never block the game loop.
Here a gymnasium env stands in for the game.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    p.add_argument("--source", type=int, default=100, help="this game's source id (unique per bot)")
    p.add_argument("--env", default="Pendulum-v1", help="the gymnasium env standing in for the game")
    p.add_argument("--episodes", type=int, default=3)
    a = p.parse_args(argv)

    import os

    os.environ.setdefault("RAY_AUTH_MODE", "token")
    from sacbot.app.cluster import prepare_address

    unreachable = prepare_address(a.address)  # before Ray is imported
    if unreachable:
        print(f"join_cluster: cannot join the Ray cluster at {a.address!r}: {unreachable}", file=sys.stderr)
        return 1
    import ray

    from sacbot import Agent
    from sacbot.acting.games import make_env, with_env_critic_obs
    from sacbot.app.ray_client import NAMESPACE, RayLearnerClient
    from sacbot.app.ray_cluster import LEARNER_NAME
    from sacbot.config import Config

    try:
        ray.init(address=a.address, namespace=NAMESPACE, log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - Ray's ConnectionError and friends: one line, not a trace
        print(f"join_cluster: cannot join the Ray cluster at {a.address!r}: {e}", file=sys.stderr)
        return 1
    try:
        learner = ray.get_actor(LEARNER_NAME, namespace=NAMESPACE)
    except ValueError:
        print(f"join_cluster: no {LEARNER_NAME!r} in the cluster at {a.address}; start one with "
              "`sacbot cluster --address auto`", file=sys.stderr)
        return 1
    env = make_env(a.env)
    cfg = with_env_critic_obs(Config(env=a.env, run_dir=f"runs/join-{a.source}", weights_path=f"runs/join-{a.source}",
                                     quiet=True), env)
    link = RayLearnerClient(learner, source=a.source)
    returns = []
    with Agent(cfg, env.observation_space, env.action_space, learner=link) as agent:
        for k in range(a.episodes):
            obs, _ = env.reset(seed=k)
            agent.new_episode("")
            done, ret = False, 0.0
            while not done:
                action = agent.act(obs)  # numpy, never waits on the learner
                obs, reward, terminated, truncated, info = env.step(action)
                agent.observe(reward, obs, terminated, truncated, info)
                ret += float(reward)
                done = terminated or truncated
            returns.append(ret)
        st = agent.status()
    print(json.dumps({"source": a.source, "episodes": len(returns), "returns": returns,
                      "policy_version": st["policy_version"], "drops": st["drops"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TankDuel: a partially observable tank duel in the spirit of Robocode Tank Royale.

Two tanks in an 800 x 600 walled arena, 30 ticks per simulated second.  Our tank is
driven by a continuous 4-dim action in [-1, 1]:

====  =============================================================================
 0    drive: target speed = a0 * 8 units/tick (accelerates 1, brakes 2 per tick)
 1    body turn: a1 * (10 - 0.75 |v|) degrees/tick (Robocode's speed-dependent limit)
 2    gun turn: a2 * 20 degrees/tick; with ``gun_control="aim"`` (the registered default),
      once the enemy has been seen, the gun instead slews (20 degrees/tick) to the bearing of
      its estimated position (obs 35) plus an offset of a2 * |a2| * 30 degrees: fine control near the
      bearing (a stationary target is hit for |a2| < ~0.3 at 400 units), and up to 30 degrees
      of lead for a moving one
 3    fire: a3 <= 0 holds fire; a3 > 0 fires a bullet of power 0.1 + 2.9 * a3 when
      the gun is cool (heat 0) and the tank has that much energy
====  =============================================================================

The radar spins on its own at 30 degrees/tick and sees the enemy only inside a 40-degree
arc (``radar_arc``, in degrees; 360 sees it every tick), so the enemy is seen for a tick or
two, then lost for ~10: where it went must be remembered.  Bullets fly at 20 - 3 * power
units/tick, deal 4 * power (+ 2 * (power - 1) above power 1) damage and return 3 * power
energy to the shooter (Robocode's rules).
Firing costs its power in energy; the gun heats by 1 + power / 5 and cools 0.1 per tick.
A tank that hits a wall stops and takes max(|v| / 2 - 1, 0) damage; colliding tanks stop
and take 0.6 each.  Each tank starts with 100 energy and dies at 0.

Reward per tick: (damage dealt - damage taken) / 10, plus +5 for a kill and -5 for a
death.  An episode terminates on a death and is truncated at ``max_ticks``.

Observation (37 values, roughly in [-1, 1]); "last seen" fields keep their value between
sightings, as a player would remember them:

=====  ==========================================================================
0-1    own x, y scaled to [-1, 1]
2-3    sin, cos of body heading
4      own speed / 8
5      own energy / 50 - 1
6-7    sin, cos of gun heading
8      gun heat / 1.6 (capped at 1)
9-10   sin, cos of radar heading
11     1 if the enemy is in the radar arc this tick
12-13  offset to the last-seen enemy position from our current position, dx / 800, dy / 600
14     distance to that position / 500 - 1
15-16  sin, cos of the bearing to that position relative to the gun
17-18  sin, cos of last-seen enemy heading
19     last-seen enemy speed / 8
20     last-seen enemy energy / 50 - 1
21     age of the last sighting: min(ticks / 30, 1) * 2 - 1 (1 if never seen)
22     1 once the enemy has been seen this episode
23     fraction of the episode left * 2 - 1
24-27  distance to the left, right, bottom, top wall / 400 - 1
28     1 if hit by a bullet this tick
29     1 if our bullet hit this tick
30     1 if we hit a wall this tick
31-32  sin, cos of the bearing to that position relative to the body
33     own bullets in flight / 5
34     (own energy - last-seen enemy energy) / 100
35     aim error: the gun's bearing error to the enemy's estimated position (dead reckoning:
       the last-seen position advanced at the last-seen velocity) in units of the target's
       angular radius there, atan(18 / distance), clipped to [-1.5, 1.5]: |x| < 1 means a
       shot fired now flies through that position (0 if never seen)
36     own bullets in flight on course to meet the enemy if it keeps its last-seen velocity
       (closest approach within 18) / 3, capped at 1
=====  ==========================================================================

``observation="radar"`` (registered as ``sacbot/TankDuelRadar-v0``) leaves memory to the
player: the observation holds only what the tank knows of itself and what the radar sees *this
tick*; nothing about the enemy survives a tick out of the arc (no last-seen fields, dead
reckoning or bullets on course).  Its gun is turned directly (``gun_control="turn"``): the aim
mode steers by the env's own memory of the last sighting.  What memory buys here is measured by
``tools/bench/radar_bounds.py``: against a target that stands still (sitting_duck, or tracker
coming straight at a still tank) a memoryless player wins as often and almost as fast, because
the tank's own state holds what it needs (a gun turned onto the target stays on it; the gun heat
and the radar's heading can carry more); against walker memory wins more.  Its 32 values:

=====  ==========================================================================
0-10   as above: own position, heading, speed, energy, gun, heat, radar heading
11     1 if the enemy is in the radar arc this tick; 12-23 are 0 when it is not
12-13  offset to the enemy, dx / 800, dy / 600
14     distance / 500 - 1
15-16  sin, cos of the bearing to the enemy relative to the gun
17-18  sin, cos of that bearing relative to the body
19-20  sin, cos of the enemy's heading
21     the gun's bearing error in target radii, clipped to [-1.5, 1.5] (as 35 above)
22     enemy speed / 8
23     enemy energy / 50 - 1
24-27  distance to the left, right, bottom, top wall / 400 - 1
28-30  this tick's events: hit by a bullet, our bullet hit, we hit a wall
31     fraction of the episode left * 2 - 1
=====  ==========================================================================

Two learning aids, for the radar observation, registered together with a 120-degree radar as
``sacbot/TankDuelRadar-v1`` (without them the learner did not learn the radar duel;
docs/experiments.md, "The radar duels and memory"):

* ``critic_info=True`` appends 14 values for the critic alone (an asymmetric critic): the enemy
  values 11-23 as if it were in the arc (11 is then always 1), and our bullets on course to it / 3.
  The env declares them (``critic_obs = 14``); sacbot reads that and never gives them to the actor,
  so what the actor, and the deployed bot, sees is still the 32 values above.
* ``shaping=True`` adds a potential-based shaping term phi(s') - phi(s) to the reward (Ng et al.,
  1999; undiscounted, so for a learner's gamma < 1 the best policy is nearly, not exactly, kept):
  phi is the damage our bullets on course will deal / 10,
  less the gun's bearing error to the enemy / 180 degrees, and 0 at an episode's end.  A shot on
  course is paid when fired rather than when it lands, and every gun turn towards the enemy pays,
  seen or not.  A return differs from the unshaped one by -phi(start), at most 1.

Opponents are scripted with stable names (see ``OPPONENTS``) and are chosen per episode
by ``schedule``: ``fixed`` (the first name), ``cycle`` or ``random``;
``reset(options={"episode_index": k})`` pins the position in the schedule.  ``info["opponent"]``
is set at reset so the runtime can send NewEpisode(opponent).
"""

from __future__ import annotations

import math
import numbers

import gymnasium as gym
import numpy as np

from sacbot.envs.tanks import (  # noqa: F401 - the duel's names, as its users import them
    AIM_OFFSET,
    CRITIC_OBS_DIM,
    GUN_RATE,
    MAX_SPEED,
    OBS_DIM,
    OPPONENTS,
    RADAR_ARC_DEG,
    RADAR_HALF_ARC,
    RADAR_OBS_DIM,
    RADAR_RATE,
    RADIUS,
    Bullet,
    H,
    Tank,
    W,
    _bearing,
    _segment_hits,
    _wrap,
    bullet_damage,
    separate,
    sitting_duck,
    spinner,
    tracker,
    walker,
)


class TankDuel(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    # The kwargs that change what the observation's values or the actions mean (their values are
    # attributes of the env).  sacbot saves them with a bot and will not resume or evaluate it
    # under others: a bot that learnt to aim would turn its gun at random (sacbot.app.driver.env_layout).
    layout_kwargs = ("observation", "gun_control", "critic_info")

    def __init__(self, opponents=("sitting_duck", "spinner", "walker", "tracker"), schedule: str = "cycle",
                 max_ticks: int = 600, render_mode: str | None = None, gun_control: str = "turn",
                 observation: str = "full", radar_arc: float = RADAR_ARC_DEG, critic_info: bool = False,
                 shaping: bool = False):
        if isinstance(opponents, str):
            opponents = (opponents,)
        if not isinstance(opponents, list | tuple):  # a dict or set would be read by its keys, in no set order
            raise ValueError(f"opponents must be a name or a list of names, got {opponents!r}")
        if not opponents:
            raise ValueError(f"opponents is empty; name at least one of {sorted(OPPONENTS)}")
        unknown = [o for o in opponents if not isinstance(o, str) or o not in OPPONENTS]
        if unknown:
            raise ValueError(f"unknown opponent(s) {unknown}; known: {sorted(OPPONENTS)}")
        if isinstance(max_ticks, bool) or not isinstance(max_ticks, numbers.Integral) or max_ticks < 1:
            raise ValueError(f"max_ticks must be an integer >= 1 (ticks before an episode is truncated), "
                             f"got {max_ticks!r}")
        if schedule not in ("fixed", "cycle", "random"):
            raise ValueError(f"schedule must be fixed, cycle or random, got {schedule!r}")
        if schedule == "fixed" and len(opponents) > 1:
            # The registered duels fix the schedule: a list given alone would play its first name
            # forever, and a run waiting for every opponent (--episodes-per-opponent) never end.
            raise ValueError(f"schedule 'fixed' plays only the first of opponents {list(opponents)}; add "
                             "\"schedule\": \"cycle\" (in turn) or \"random\" to play them all, or give one name")
        if gun_control not in ("turn", "aim"):
            raise ValueError(f"gun_control must be 'turn' or 'aim', got {gun_control!r}")
        if observation not in ("full", "radar"):
            raise ValueError(f"observation must be 'full' or 'radar', got {observation!r}")
        if observation == "radar" and gun_control == "aim":
            # The aim mode slews the gun to the env's estimate from the last sighting: memory
            # held by the env, which the radar observation exists to leave to the learner.
            raise ValueError("observation='radar' needs gun_control='turn': the aim mode steers by the "
                             "env's memory of the last sighting")
        self.gun_control, self.observation = gun_control, observation
        # The radar's arc width in degrees; 360 sees the enemy every tick.  No registered duel
        # changes it: it exists to measure how learning depends on how often the enemy is seen,
        # and for curricula that start wide (docs/experiments.md, "The radar duels and memory").
        if isinstance(radar_arc, bool) or not isinstance(radar_arc, numbers.Real) \
                or not 0.0 < float(radar_arc) <= 360.0:
            raise ValueError(f"radar_arc must be a number of degrees in (0, 360], got {radar_arc!r}")
        self.radar_arc = float(radar_arc)
        self.radar_half_arc = math.radians(self.radar_arc) / 2
        for name, flag in (("critic_info", critic_info), ("shaping", shaping)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be true or false, got {flag!r}")
        if critic_info and observation != "radar":
            raise ValueError("critic_info=True needs observation='radar': the full observation has no hidden "
                             "state to give the critic")
        # The shaped reward reads the enemy's true position, so it must not become an input
        # (sacbot refuses reward_input when an env says so).
        self.shaping = self.privileged_reward = shaping
        # The number of trailing observation values for the critic alone; sacbot reads this
        # attribute and never gives them to the actor (Config.critic_obs).
        self.critic_info = critic_info
        self.critic_obs = CRITIC_OBS_DIM if critic_info else 0
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.opponents, self.schedule, self.max_ticks = tuple(opponents), schedule, int(max_ticks)
        self.render_mode = render_mode
        dim = (RADAR_OBS_DIM if observation == "radar" else OBS_DIM) + self.critic_obs
        self.observation_space = gym.spaces.Box(-1.5, 1.5, (dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self._episode = -1

    # --- episode -------------------------------------------------------------------------
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        # The schedule position: options["episode_index"] pins it (sacbot's driver passes
        # the run's episode count, so a resumed run meets the same opponents); a seeded
        # reset without it restarts the schedule, so a seed alone determines the episode.
        if options and "episode_index" in options:
            self._episode = int(options["episode_index"])
        elif seed is not None:
            self._episode = 0
        else:
            self._episode += 1
        if self.schedule == "fixed":
            self.opponent = self.opponents[0]
        elif self.schedule == "cycle":
            self.opponent = self.opponents[self._episode % len(self.opponents)]
        else:
            self.opponent = self.opponents[int(rng.integers(len(self.opponents)))]
        while True:
            a = Tank(rng.uniform(100, W - 100), rng.uniform(100, H - 100), rng.uniform(-math.pi, math.pi), 0.0)
            b = Tank(rng.uniform(100, W - 100), rng.uniform(100, H - 100), rng.uniform(-math.pi, math.pi), 0.0)
            if math.hypot(a.x - b.x, a.y - b.y) > 250:
                break
        a.gun = a.radar = a.heading
        b.gun = b.radar = b.heading
        self.me, self.enemy = a, b
        self.bullets: list[Bullet] = []
        self.tick = 0
        self._seen = None  # (dx, dy, dist, heading, speed, energy) at the last sighting
        self._seen_tick = -(10**9)
        self._events = (0.0, 0.0, 0.0)
        self._see()
        self._potential = self._shaping_potential() if self.shaping else 0.0
        return self._obs(), {"opponent": self.opponent}

    def step(self, action):
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (4,) or not all(map(math.isfinite, a.tolist())):
            raise ValueError(f"TankDuel action must be 4 finite values in [-1, 1], got {action!r}")
        # Plain floats from here: numpy calls on 4-element arrays cost more than the maths.
        a0, a1, a2, a3 = (min(1.0, max(-1.0, v)) for v in a.tolist())
        me, en = self.me, self.enemy
        e_speed, e_turn, e_gun, e_fire = OPPONENTS[self.opponent](self, en, me)
        dealt = taken = 0.0
        # fire first (with the gun as it points now), then move
        power = 0.1 + 2.9 * a3 if a3 > 0 else 0.0
        spent = self._fire(me, power, owner=0)
        self._fire(en, e_fire, owner=1)
        regained = 0.0
        if self.gun_control == "aim" and self._seen is not None:
            # Aim mode: a2 sets an offset from the bearing to the enemy's estimated position,
            # squared so that small actions aim finely and the ends still lead a moving target
            # by up to AIM_OFFSET; the gun slews there at GUN_RATE.
            ex, ey = self._estimate()
            want = math.atan2(ex - me.x, ey - me.y) + a2 * abs(a2) * AIM_OFFSET
            me.gun = _wrap(me.gun + max(-GUN_RATE, min(GUN_RATE, _wrap(want - me.gun))))
        else:
            me.gun = _wrap(me.gun + a2 * GUN_RATE)
        en.gun = _wrap(en.gun + max(-GUN_RATE, min(GUN_RATE, e_gun)))
        me.drive(a0 * MAX_SPEED, a1 * math.radians(10.0))
        en.drive(e_speed, e_turn)
        taken += self._walls(me)
        wall_me = float(self._hit_wall)
        self._walls(en)
        if math.hypot(me.x - en.x, me.y - en.y) < 2 * RADIUS:  # collision: both stop, 0.6 each
            separate(me, en)
            me.energy -= 0.6
            en.energy -= 0.6
            taken += 0.6
            dealt += 0.6
        hit_me = hit_en = 0.0
        keep = []
        for bl in self.bullets:
            x0, y0 = bl.x, bl.y
            bl.x += bl.dx
            bl.y += bl.dy
            target = en if bl.owner == 0 else me
            if _segment_hits(x0, y0, bl.x, bl.y, target.x, target.y, RADIUS):
                dmg = bullet_damage(bl.power)
                target.energy -= dmg
                shooter = me if bl.owner == 0 else en
                shooter.energy += 3.0 * bl.power
                if bl.owner == 0:
                    regained += 3.0 * bl.power
                    dealt += dmg
                    hit_en = 1.0
                else:
                    taken += dmg
                    hit_me = 1.0
            elif 0 <= bl.x <= W and 0 <= bl.y <= H:
                keep.append(bl)
        self.bullets = keep
        for t in (me, en):
            t.heat = max(0.0, t.heat - 0.1)
            t.radar = _wrap(t.radar + RADAR_RATE)
        self.tick += 1
        self._events = (hit_me, hit_en, wall_me)
        self._see()
        reward = (dealt - taken) / 10.0
        terminated = me.energy <= 0 or en.energy <= 0
        won = en.energy <= 0 < me.energy
        lost = me.energy <= 0
        if won:
            reward += 5.0
        elif lost:
            reward -= 5.0
        truncated = not terminated and self.tick >= self.max_ticks
        if self.shaping:
            # Potential-based shaping (Ng et al., 1999): reward += phi(s') - phi(s).  phi credits a
            # shot on course with its damage when it leaves the gun (taken back when it lands, or
            # leaves the course), instead of ~30 ticks later, and pays the gun's turn towards the
            # enemy every tick, seen or not.  phi is 0 at an episode's end, so a return differs from
            # the unshaped one by -phi(start) alone.  Not exactly policy-invariant for a learner
            # that discounts (Ng's term is gamma * phi(s'), and the env does not know gamma): at
            # 0.99 a shot that is on course when fired nets (1 - 0.99^k) of its credit even if the
            # target then turns away, and zeroing phi at truncation, where the learner bootstraps,
            # errs on that one tick.  Kept so: the duel was measured with it (docs/experiments.md).
            potential = 0.0 if terminated or truncated else self._shaping_potential()
            reward += potential - self._potential
            self._potential = potential
        info = {"opponent": self.opponent, "won": bool(won), "lost": bool(lost),
                "damage_dealt": dealt, "damage_taken": taken, "energy_spent": spent,
                "energy_regained": regained}
        return self._obs(), float(reward), bool(terminated), bool(truncated), info

    # --- physics helpers --------------------------------------------------------------
    _hit_wall = False

    def _fire(self, t: Tank, power: float, owner: int) -> float:
        """Fire if the gun is cool and energy allows; returns the energy spent."""
        if power <= 0.0 or t.heat > 0.0:
            return 0.0
        power = max(0.1, min(3.0, power))
        if t.energy <= power:
            return 0.0
        t.energy -= power
        t.heat = 1.0 + power / 5.0
        self.bullets.append(Bullet(t.x + RADIUS * math.sin(t.gun), t.y + RADIUS * math.cos(t.gun), t.gun,
                                   power, owner))
        return power

    def _walls(self, t: Tank) -> float:
        x = min(max(t.x, RADIUS), W - RADIUS)
        y = min(max(t.y, RADIUS), H - RADIUS)
        self._hit_wall = x != t.x or y != t.y
        if not self._hit_wall:
            return 0.0
        dmg = max(abs(t.v) / 2.0 - 1.0, 0.0)
        t.x, t.y, t.v = x, y, 0.0
        t.energy -= dmg
        return dmg

    def in_radar_arc(self) -> bool:
        me, en = self.me, self.enemy
        return abs(_wrap(_bearing(me, en.x, en.y) - me.radar)) <= self.radar_half_arc

    def _see(self) -> None:
        if self.in_radar_arc():
            en = self.enemy
            self._seen = (en.x, en.y, en.heading, en.v, en.energy)
            self._seen_tick = self.tick

    def _estimate(self) -> tuple[float, float]:
        """Dead reckoning, as a player would: the last-seen position advanced along the last-seen
        heading at the last-seen speed for the ticks since, kept inside the walls."""
        x, y, h, v, _ = self._seen
        t = self.tick - self._seen_tick
        return (min(max(x + v * t * math.sin(h), RADIUS), W - RADIUS),
                min(max(y + v * t * math.cos(h), RADIUS), H - RADIUS))

    def _on_course(self, x: float, y: float, heading: float, speed: float) -> list[Bullet]:
        """Our bullets in flight that meet a target at (x, y) if it keeps this heading and speed
        (closest approach within its radius, still ahead of the bullet)."""
        vx, vy = speed * math.sin(heading), speed * math.cos(heading)
        hits = []
        for b in self.bullets:
            if b.owner == 0:
                rx, ry = x - b.x, y - b.y  # target relative to the bullet ...
                wx, wy = vx - b.dx, vy - b.dy  # ... and its relative velocity
                w2 = wx * wx + wy * wy
                t = max(0.0, -(rx * wx + ry * wy) / w2) if w2 > 0 else 0.0
                cx, cy = rx + wx * t, ry + wy * t
                if t > 0 and cx * cx + cy * cy <= RADIUS * RADIUS:
                    hits.append(b)
        return hits

    def _shaping_potential(self) -> float:
        """The damage our bullets on course to the enemy (its true state) will deal, as reward,
        less the gun's bearing error to the enemy (a reward of 1 for 180 degrees)."""
        en, me = self.enemy, self.me
        credit = sum(bullet_damage(b.power) for b in self._on_course(en.x, en.y, en.heading, en.v)) / 10.0
        return credit - abs(_wrap(_bearing(me, en.x, en.y) - me.gun)) / math.pi

    def _obs(self) -> np.ndarray:
        if self.observation == "radar":
            return self._radar_obs()
        me = self.me
        seen_now = 1.0 if self._seen_tick == self.tick else 0.0
        if self._seen is None:
            dx = dy = 0.0
            dist, eh, ev, ee, ever, age = 500.0, 0.0, 0.0, 100.0, 0.0, 1.0
        else:
            # Where the enemy was last seen, as seen from where we are now: a player
            # remembers the position, not the bearing it had at the time.
            ex, ey, eh, ev, ee = self._seen
            dx, dy = ex - me.x, ey - me.y
            dist = math.hypot(dx, dy)
            ever = 1.0
            age = min((self.tick - self._seen_tick) / 30.0, 1.0)
        bearing = math.atan2(dx, dy) if self._seen is not None else me.gun
        rel_gun, rel_body = _wrap(bearing - me.gun), _wrap(bearing - me.heading)
        hit_me, hit_en, wall = self._events
        own_bullets = sum(1 for b in self.bullets if b.owner == 0)
        # Robocode gives a bot its bullets; whether one is on course tells the critic at once
        # what a shot is worth, instead of ~30 ticks later when it lands.
        # Both this and the aim error use the dead-reckoned position, and a bullet counts as on
        # course if it meets a target that keeps its last-seen velocity.
        aim_err, on_course = 0.0, 0
        if self._seen is not None:
            px, py = self._estimate()
            gx, gy = px - me.x, py - me.y
            aim_err = _wrap(math.atan2(gx, gy) - me.gun) / math.atan2(RADIUS, max(math.hypot(gx, gy), RADIUS))
            on_course = len(self._on_course(px, py, self._seen[2], self._seen[3]))
        obs = np.array([
            me.x / (W / 2) - 1, me.y / (H / 2) - 1, math.sin(me.heading), math.cos(me.heading),
            me.v / MAX_SPEED, me.energy / 50 - 1, math.sin(me.gun), math.cos(me.gun), min(me.heat / 1.6, 1.0),
            math.sin(me.radar), math.cos(me.radar), seen_now, dx / W, dy / H, dist / 500 - 1,
            math.sin(rel_gun), math.cos(rel_gun), math.sin(eh), math.cos(eh), ev / MAX_SPEED, ee / 50 - 1,
            age * 2 - 1, ever, (1 - self.tick / self.max_ticks) * 2 - 1,
            me.x / 400 - 1, (W - me.x) / 400 - 1, me.y / 400 - 1, (H - me.y) / 400 - 1,
            hit_me, hit_en, wall, math.sin(rel_body), math.cos(rel_body), min(own_bullets / 5, 1.0),
            (me.energy - ee) / 100,
            # A player sees whether the gun is on the target; in raw angle that is a bump a few
            # degrees wide, which a critic resolves slowly, so it is given in target radii.
            aim_err,
            min(on_course / 3, 1.0),
        ], dtype=np.float32)
        np.minimum(obs, 1.5, out=obs)
        return np.maximum(obs, -1.5, out=obs)

    def _enemy_fields(self) -> tuple[float, ...]:
        """The radar observation's enemy values (11-23: the 'seen' flag, then 12 more), from the truth."""
        me, en = self.me, self.enemy
        dx, dy = en.x - me.x, en.y - me.y
        dist = math.hypot(dx, dy)
        b = math.atan2(dx, dy)
        rel_gun, rel_body = _wrap(b - me.gun), _wrap(b - me.heading)
        aim = max(-1.5, min(1.5, rel_gun / math.atan2(RADIUS, max(dist, RADIUS))))
        return (1.0, dx / W, dy / H, dist / 500 - 1, math.sin(rel_gun), math.cos(rel_gun),
                math.sin(rel_body), math.cos(rel_body), math.sin(en.heading), math.cos(en.heading),
                aim, en.v / MAX_SPEED, en.energy / 50 - 1)

    def _radar_obs(self) -> np.ndarray:
        """What the tank knows of itself and what the radar sees this tick, nothing older; then,
        with ``critic_info``, the values for the critic alone."""
        me, en = self.me, self.enemy
        in_arc = self.in_radar_arc()
        truth = self._enemy_fields() if in_arc or self.critic_obs else ()  # computed once for both parts
        seen = truth if in_arc else (0.0,) * 13
        critic: tuple[float, ...] = ()
        if self.critic_obs:  # the enemy as if in the arc, and our bullets on course to it
            critic = (*truth, min(len(self._on_course(en.x, en.y, en.heading, en.v)) / 3, 1.0))
        obs = np.array([
            me.x / (W / 2) - 1, me.y / (H / 2) - 1, math.sin(me.heading), math.cos(me.heading),
            me.v / MAX_SPEED, me.energy / 50 - 1, math.sin(me.gun), math.cos(me.gun), min(me.heat / 1.6, 1.0),
            math.sin(me.radar), math.cos(me.radar), *seen,
            me.x / 400 - 1, (W - me.x) / 400 - 1, me.y / 400 - 1, (H - me.y) / 400 - 1, *self._events,
            (1 - self.tick / self.max_ticks) * 2 - 1, *critic], dtype=np.float32)
        return np.clip(obs, -1.5, 1.5, out=obs)

    # --- rendering ---------------------------------------------------------------------
    def render(self):
        if self.render_mode != "rgb_array":
            return None
        from .tank_render import draw
        return draw(self)

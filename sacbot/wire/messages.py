"""Messages from acting to training, as plain data with a msgpack wire form.

Only numpy arrays, Python scalars and strings cross a thread boundary (never a torch object:
the acting side imports no torch), so every message can be sent between processes unchanged::

    msg = Transition(obs, action, reward, next_obs, terminated, truncated)
    assert decode(encode(msg)) == msg      # arrays compare with np.array_equal
    [block] = decode_batch(encode_batch([msg, msg]))   # a run of transitions travels as columns
    assert block.rows() == [msg, msg]

``make_transition`` is the acting boundary: it validates shapes, dtype and finiteness
and raises :class:`MessageError` at the call that produced bad data, so nothing bad
reaches the replay buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np


class MessageError(ValueError):
    """A message is malformed: bad shapes, non-finite values or undecodable bytes."""


@dataclass(frozen=True, eq=False)
class Transition:
    obs: np.ndarray
    action: np.ndarray
    reward: float
    next_obs: np.ndarray
    terminated: bool
    truncated: bool

    def __eq__(self, other):
        return (isinstance(other, Transition) and np.array_equal(self.obs, other.obs)
                and np.array_equal(self.action, other.action) and self.reward == other.reward
                and np.array_equal(self.next_obs, other.next_obs)
                and self.terminated == other.terminated and self.truncated == other.truncated)


@dataclass(frozen=True)
class NewEpisode:
    """An episode starts.  ``opponent`` is a stable identity key (a name, else an id).

    ``gap``: not a new episode but the same one going on after transitions of it were lost (a
    full queue dropped them): the replay starts a new chain here, so that no sampled sequence
    steps over the missing ticks, and no episode is counted."""

    opponent: str = ""
    gap: bool = False


@dataclass(frozen=True)
class Shutdown:
    """The bot closes: the learner takes what came before this, makes the final save and exits.
    ``acting_rng`` is the acting noise generator's state (JSON), saved so a resume continues it."""

    acting_rng: str = ""


@dataclass(frozen=True, eq=False)
class Transitions:
    """Consecutive transitions of one bot as columns, row ``k`` being its ``k``-th transition:
    what a batch carries across a process or machine boundary.  One array per field, so the
    learner decodes and stores a batch with a few numpy calls rather than a few per transition
    (``encode_batch`` groups runs of :class:`Transition`; ``rows()`` gives them back)."""

    obs: np.ndarray  # (n, obs_dim) float32
    action: np.ndarray  # (n, act_dim) float32
    reward: np.ndarray  # (n,) float64: a Transition's reward exactly
    next_obs: np.ndarray  # (n, obs_dim) float32
    terminated: np.ndarray  # (n,) bool
    truncated: np.ndarray  # (n,) bool

    @classmethod
    def of(cls, run: list[Transition]) -> Transitions:
        return cls(np.stack([t.obs for t in run]), np.stack([t.action for t in run]),
                   np.array([t.reward for t in run], np.float64), np.stack([t.next_obs for t in run]),
                   np.array([t.terminated for t in run], np.bool_), np.array([t.truncated for t in run], np.bool_))

    def __len__(self) -> int:
        return len(self.reward)

    def rows(self) -> list[Transition]:
        return [Transition(self.obs[k], self.action[k], float(self.reward[k]), self.next_obs[k],
                           bool(self.terminated[k]), bool(self.truncated[k])) for k in range(len(self))]


Message = Transition | Transitions | NewEpisode | Shutdown


_F32_MAX = float(np.finfo(np.float32).max)
# Rewards past this overflow the critic even though they fit float32: a TD target is about
# r / (1 - gamma), and the loss sums squared errors over a batch, so 3e38 (or 1e20) becomes inf
# within a few updates.  1e9 keeps (100 r)^2 times a batch of thousands inside float32 by many
# orders of magnitude; a game whose scores are larger should scale its rewards.
MAX_ABS_REWARD = 1e9
# Observations past this kill the learner the same way (3e38 in a 4-value observation gave NaN
# gradients within 16 steps) and, long before, saturate every unit the first layer feeds: no game
# state needs them, and a FLT_MAX "no target" sentinel should be mapped to something small.
MAX_ABS_OBS = 1e9
MAX_OPPONENT_CHARS = 256  # an identity key, written into every episode line and checkpoint


def check_vector(name: str, x, dim: int, shape: tuple[int, ...] | None = None,
                 max_abs: float | None = None) -> np.ndarray:
    """``x`` as a finite float32 vector of ``dim`` values, or a MessageError naming the problem.
    Always a copy: a game loop that refills one buffer every tick must not rewrite what was stored.
    ``max_abs`` bounds each value's size (observations: ``MAX_ABS_OBS``).

    ``shape`` is the shape the caller's space promises (a Box observation of any rank); without
    it, ``x`` must be ``(dim,)``.  Numbers only: numeric strings and complex values are refused
    rather than converted, since ``float("1.5")`` or dropping an imaginary part would hide a bug
    in the game loop.  Values must be finite *as float32*: 1e300 is finite in float64 but
    becomes inf in the replay, and one inf turns every loss into NaN."""
    want = tuple(shape) if shape is not None else (dim,)
    try:
        raw = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise MessageError(f"{name} is not numeric ({type(x).__name__}): {e}") from None
    if raw.dtype.kind not in "biuf":
        raise MessageError(f"{name} must hold real numbers (bool, int or float), got dtype {raw.dtype} "
                           f"from {type(x).__name__}")
    if raw.shape != want:
        raise MessageError(f"{name} has shape {raw.shape}, expected {want}")
    with np.errstate(over="ignore", invalid="ignore"):
        a = raw.astype(np.float32, copy=True).reshape(-1)
    # One comparison on the acting path: NaN compares false, so it catches non-finite values too.
    if (np.abs(a) <= (_F32_MAX if max_abs is None else max_abs)).all():
        return a
    if not np.isfinite(a).all():
        bad = np.flatnonzero(~np.isfinite(a))[:5].tolist()
        raise MessageError(f"{name} has non-finite values (as float32: |x| <= {_F32_MAX:.3g}) "
                           f"at indices {bad}: {raw.reshape(-1)[bad].tolist()}")
    bad = np.flatnonzero(np.abs(a) > max_abs)[:5].tolist()
    raise MessageError(f"{name} has values above {max_abs:.0e} in size at indices {bad}: "
                       f"{raw.reshape(-1)[bad].tolist()} (they saturate the networks and overflow "
                       "their gradients; scale the observation, or map sentinels to small values)")


def shown(value, limit: int = 80) -> str:
    """``value`` for an error message, at most about ``limit`` characters: the repr of a scalar, the
    type and size of anything else (a repr of hostile input can nest a thousand levels deep, past
    Python's recursion limit, or run to megabytes)."""
    if value is None or isinstance(value, bool | int | float | complex | str | bytes | np.generic):
        r = repr(value)
        return r if len(r) <= limit else r[: max(1, limit - 3)] + "..."
    try:
        return f"a {type(value).__name__} of {len(value)} items"
    except TypeError:
        return f"a {type(value).__name__}"


def check_reward(reward) -> float:
    """A finite reward of at most ``MAX_ABS_REWARD`` in size, as a Python float."""
    if isinstance(reward, str | bytes) or isinstance(reward, complex | np.complexfloating):
        # float("1") would pass: a game loop's bug, not a reward
        raise MessageError(f"reward must be a real number, got {shown(reward)}")
    try:
        r = float(reward)
    except (TypeError, ValueError):
        raise MessageError(f"reward must be a finite number, got {shown(reward)}") from None
    except OverflowError:  # an int too large for a float (10**400)
        raise MessageError(f"reward must be finite with |r| <= {MAX_ABS_REWARD:.0e}, got an integer of "
                           f"{int(reward).bit_length()} bits") from None
    if not (np.isfinite(r) and abs(r) <= MAX_ABS_REWARD):
        raise MessageError(f"reward must be finite with |r| <= {MAX_ABS_REWARD:.0e} (larger ones overflow the "
                           f"critic's float32 losses; scale the game's rewards), got {shown(reward)}")
    return r


def check_opponent(opponent) -> str:
    """An opponent's identity key: a str (or an int id, as its decimal text) that encodes as UTF-8,
    of at most ``MAX_OPPONENT_CHARS``.  Any other object's ``str()`` may hold a memory address, a
    new "opponent" every episode, and each change clears the bot's replay; a lone surrogate
    cannot be written into a checkpoint, so every save would fail."""
    if isinstance(opponent, int | np.integer) and not isinstance(opponent, bool | np.bool_):
        return str(int(opponent))
    if not isinstance(opponent, str):
        raise MessageError(f"opponent must be a str (a stable name) or an int id, got {type(opponent).__name__} "
                           f"{shown(opponent)}")
    try:
        opponent.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MessageError(f"opponent {shown(opponent)} is not valid text ({e.reason} at {e.start}); it would "
                           "make every checkpoint unwritable") from None
    if len(opponent) > MAX_OPPONENT_CHARS:
        raise MessageError(f"opponent is {len(opponent)} characters, at most {MAX_OPPONENT_CHARS} accepted "
                           "(an identity key, not a description)")
    return opponent


def check_flag(name: str, value) -> bool:
    """``terminated``/``truncated``: a bool, or an integer 0/1.  ``bool("no")`` is True, so
    strings and other objects are refused rather than guessed at."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer) and value in (0, 1):
        return bool(value)
    raise MessageError(f"{name} must be a bool (or 0/1), got {shown(value)}")


def make_transition(obs, action, reward, next_obs, terminated, truncated, *, obs_dim: int,
                    act_dim: int) -> Transition:
    """Validate at the acting boundary: float32, shapes as the spaces say, finite."""
    return Transition(check_vector("obs", obs, obs_dim, max_abs=MAX_ABS_OBS), check_vector("action", action, act_dim),
                      check_reward(reward), check_vector("next_obs", next_obs, obs_dim, max_abs=MAX_ABS_OBS),
                      check_flag("terminated", terminated), check_flag("truncated", truncated))


# --- msgpack wire form -----------------------------------------------------------------
_ND = 1  # ext type code of a numpy array


def _default(obj):
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise MessageError("object arrays cannot be sent")
        header = msgpack.packb([obj.dtype.str, list(obj.shape)])
        return msgpack.ExtType(_ND, header + np.ascontiguousarray(obj).tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code, data):
    if code != _ND:
        raise MessageError(f"unknown msgpack ext type {code}")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data))
    unpacker.feed(data)
    dtype, shape = next(unpacker)
    header_len = unpacker.tell()
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise MessageError("object arrays are refused")
    arr = np.frombuffer(data, dtype=dt, offset=header_len)
    return arr.reshape(shape).copy()


def pack(obj) -> bytes:
    """msgpack with numpy arrays as an ext type; no pickle anywhere."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes, max_size: int = 1 << 30):
    """Decode; msgpack bounds every container and string by ``len(data)``, and
    ``len(data)`` is bounded here, so hostile input cannot allocate without limit."""
    if len(data) > max_size:
        raise MessageError(f"msgpack data of {len(data)} bytes exceeds the limit {max_size}")
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except MessageError:
        raise
    except Exception as e:  # msgpack raises several types; callers get one
        raise MessageError(f"malformed msgpack data ({type(e).__name__}: {e})") from None


def _body(msg: Message) -> list:
    if isinstance(msg, Transition):
        return ["T", msg.obs, msg.action, msg.reward, msg.next_obs, msg.terminated, msg.truncated]
    if isinstance(msg, Transitions):
        return ["B", msg.obs, msg.action, msg.reward, msg.next_obs, msg.terminated, msg.truncated]
    if isinstance(msg, NewEpisode):
        return ["N", msg.opponent, True] if msg.gap else ["N", msg.opponent]
    if isinstance(msg, Shutdown):
        return ["S", msg.acting_rng]
    raise MessageError(f"not a message: {type(msg).__name__}")


def _from_body(body) -> Message:
    try:
        kind = body[0]
        if kind == "T" and len(body) == 7:
            obs, action, reward, next_obs, term, trunc = body[1:]
            if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 1
                       for a in (obs, action, next_obs)):
                raise MessageError("transition arrays missing or not float32 vectors")
            if not all(isinstance(f, bool) for f in (term, trunc)) or not isinstance(reward, float | int):
                raise MessageError("transition flags or reward of the wrong type")
            return Transition(obs, action, float(reward), next_obs, term, trunc)
        if kind == "B" and len(body) == 7:
            return _block(*body[1:])
        if kind == "N" and len(body) in (2, 3) and isinstance(body[1], str):
            gap = body[2] if len(body) == 3 else False  # a peer without gaps sends two fields
            if isinstance(gap, bool):
                return NewEpisode(check_opponent(body[1]), gap=gap)
        if kind == "S" and len(body) == 2 and isinstance(body[1], str):
            return Shutdown(body[1])
    except (TypeError, IndexError, KeyError, ValueError) as e:
        if isinstance(e, MessageError):
            raise
        raise MessageError(f"malformed message: {e}") from None
    raise MessageError(f"malformed message: {str(body)[:80]}")


def _block(obs, action, reward, next_obs, term, trunc) -> Transitions:
    """Check a decoded block's columns: types and a common length (values are the receiver's)."""
    cols = (obs, action, reward, next_obs, term, trunc)
    if not all(isinstance(a, np.ndarray) for a in cols):
        raise MessageError("transition block columns must be arrays")
    if reward.ndim != 1 or len(reward) < 1:
        raise MessageError(f"a transition block needs a 1-D reward column of one row or more, got {reward.shape}")
    n = len(reward)
    if any(a.shape[:1] != (n,) for a in cols):
        raise MessageError(f"transition block columns differ in length: {[a.shape for a in cols]}")
    if not (all(a.dtype == np.float32 and a.ndim == 2 for a in (obs, action, next_obs))
            and obs.shape == next_obs.shape and reward.dtype == np.float64
            and term.dtype == np.bool_ and trunc.dtype == np.bool_ and term.ndim == trunc.ndim == 1):
        raise MessageError("transition block columns of the wrong dtype or rank: "
                           f"{[(a.dtype.str, a.shape) for a in cols]}")
    return Transitions(*cols)


def encode(msg: Message) -> bytes:
    return pack(_body(msg))


def decode(data: bytes) -> Message:
    return _from_body(unpack(data))


def encode_batch(msgs: list[Message]) -> bytes:
    """Several messages as one msgpack array: what crosses a process or machine boundary.  Each
    run of transitions goes as one :class:`Transitions` block (six arrays, whatever its length)."""
    out: list = []
    run: list[Transition] = []
    for m in msgs:
        if isinstance(m, Transition):
            run.append(m)
            continue
        if run:
            out.append(_body(Transitions.of(run)))
            run = []
        out.append(_body(m))
    if run:
        out.append(_body(Transitions.of(run)))
    return pack(out)


def decode_batch(data: bytes) -> list[Message]:
    """The messages of ``encode_batch``, runs of transitions as :class:`Transitions` blocks."""
    body = unpack(data)
    if not isinstance(body, list):
        raise MessageError(f"a message batch must be a msgpack array, got {type(body).__name__}")
    return [_from_body(b) for b in body]

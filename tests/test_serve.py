"""sacbot serve: the protocol through the Python client, bad input, reconnects, eval, and the
server as a process (kill -9, restart, signals, refused settings).

Every wait here is on a reply, a line the server prints, or its status; sockets carry timeouts and
every test a hard one."""

from __future__ import annotations

import contextlib
import math
import os
import re
import select
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import weakref

import msgpack
import numpy as np
import pytest
from conftest import break_learner
from helpers import StderrWatcher, dir_digests, wait_until

from sacbot.config import Config, ConfigError
from sacbot.serve import PROTOCOL_VERSION
from sacbot.serve.client import SacbotClient, ServerError
from sacbot.serve.protocol import FrameReader, PeerClosed, decode_body, encode_frame
from sacbot.serve.server import ServeOptions, Server
from sacbot.store import checkpoint as ck

SACBOT = [sys.executable, "-m", "sacbot"]
# Tiny learner settings (tests/test_ownership.py's SMALL): a gradient step takes milliseconds.
SMALL_CFG = dict(env="external", hidden=32, batch_size=8, seq_len=8, learning_starts=64, calib_updates=8, quiet=True)
SMALL = ["--hidden", "32", "--batch-size", "8", "--seq-len", "8", "--learning-starts", "64", "--calib-updates", "8",
         "--quiet"]
OBS = {"shape": [3], "low": -1.0, "high": 1.0}
ACT = {"shape": [1], "low": [-2.0], "high": [2.0]}
TOKEN = "a-token-of-twenty-chars"


@contextlib.contextmanager
def serving(tmp_path, **opts):
    """A server in this process (port 0), stopped with every bot's final save at the end."""
    cfg = Config(**{**SMALL_CFG, **opts.pop("cfg", {})})
    stop = threading.Event()
    server = Server(cfg, ServeOptions(root=str(tmp_path / "root"), port=opts.pop("port", 0), **opts), stop)
    server.start()
    try:
        yield server
    finally:
        server.code = server.shutdown()


def client(server, bot="b", **kw) -> SacbotClient:
    where = {"socket_path": server.opts.socket_path} if server.port is None else {"port": server.port}
    return SacbotClient(bot, kw.pop("obs", OBS), kw.pop("act", ACT), token=kw.pop("token", server.opts.token),
                        timeout=20, hello_timeout=120, connect_for=5, **where, **kw)


def play(c: SacbotClient, ticks: int, *, end: bool = True, won: bool | None = None, seed: int = 0):
    """An episode of ``ticks`` actions of a toy game; ``end``: the last outcome ends it (truncated).
    Returns the actions."""
    rng = np.random.default_rng(seed)
    c.new_episode("toy")
    obs, reward, actions = np.zeros(3), None, []
    for _ in range(ticks):
        a = c.step(obs, reward)
        assert a is not None and a.shape == (1,) and -2 <= a[0] <= 2, a
        actions.append(float(a[0]))
        obs, reward = rng.uniform(-1, 1, 3), -abs(float(a[0]) - 1)
    if end:
        assert c.step(obs, reward, truncated=True, info=None if won is None else {"won": won}) is None
    return actions


def raw(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    return s


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def hello(bot="bad", **kw) -> dict:
    return {"type": "hello", "version": PROTOCOL_VERSION, "bot": bot, "obs_space": OBS, "action_space": ACT,
            "token": TOKEN, **kw}


_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # one per socket: it keeps bytes past a frame


def reply(sock: socket.socket, timeout: float = 20) -> dict:
    reader = _READERS.setdefault(sock, FrameReader(sock))
    return decode_body(reader.read(idle_timeout=timeout, frame_timeout=timeout))


def expect_error(sock: socket.socket, code: str, *needles: str, bystander: SacbotClient | None = None) -> dict:
    """The error frame the server answers with, then the server's close.  While waiting, the
    ``bystander`` keeps stepping: it must get an action every time (other clients do not notice)."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    steps = 0
    try:
        while not sel.select(timeout=0.05):  # wake when the bad client's reply comes
            if bystander is not None:
                assert bystander.step(np.zeros(3), 0.0) is not None
                steps += 1
            assert steps < 2000, "no reply to the bad client"
    finally:
        sel.close()
    msg = reply(sock)
    assert msg["type"] == "error" and msg["code"] == code, msg
    for n in needles:
        assert n in msg["message"], msg
    assert "expected" in msg["message"], msg  # what was wrong, and what is expected
    sock.settimeout(20)
    try:
        assert sock.recv(1) == b"", "the server closes the connection after an error"
    except ConnectionResetError:  # closed while this client was still sending: a close all the same
        pass
    sock.close()
    if bystander is not None:
        assert bystander.step(np.zeros(3), 0.0) is not None
    return msg


# --- the protocol, through the Python client ---------------------------------------------------------
@pytest.mark.timeout(120)
def test_hello_a_training_episode_and_close(tmp_path):
    with serving(tmp_path, cfg={"pace": "lockstep"}) as server:
        with client(server) as c:
            w = c.welcome
            assert (w["version"], w["bot"], w["mode"], w["ticks"], w["episodes"], w["resumed_from"]) == \
                (PROTOCOL_VERSION, "b", "train", 0, 0, None)
            assert w["settings"]["env"] == "external" and w["settings"]["hidden"] == 32
            assert w["weights"] == str(tmp_path / "root" / "b" / "weights")
            play(c, 40)
            play(c, 40, won=True)
            assert c.last["tick"] == 80 and c.last["episode"] == 1
            assert c.last["policy_version"] > 1  # lockstep: the learner trained and published before this reply
        st = server.status()["bots"]["b"]
        assert (st["ticks"], st["episodes"], st["env_steps_received"], st["connected"]) == (80, 2, 80, False)
    assert server.code == 0
    meta = ck.read_checkpoint(str(tmp_path / "root" / "b" / "weights" / "sac_latest.zip"))["meta"]
    # Every action got its outcome: 80 transitions, none made up; 80 - 64 (learning_starts) + 1 steps.
    assert meta["env_steps"] == 80 and meta["grad_steps"] == 17 and meta["episodes"] == 2
    lines = (tmp_path / "root" / "b" / "run" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"won": true' in lines[1] and '"length": 40' in lines[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hold_ms", [0.0, 5000.0])
def test_hold_ms_paces_a_fast_game_to_its_learner_and_nothing_is_dropped(tmp_path, hold_ms):
    # A learner far slower than the game (4 updates a transition, a queue of 16): unheld, the game outruns it and
    # the queue drops; held, every reply waits while the learner is over half a queue behind.
    cfg = {"pace": "learner", "queue_size": 16, "utd_ratio": 4.0}
    with serving(tmp_path, cfg=cfg, hold_ms=hold_ms) as server, client(server) as c:
        play(c, 300)
        st = server.status()["bots"]["b"]
        assert st["holds"] == (299 if hold_ms else 0)  # every step after the first, in the episode
        if hold_ms:
            assert st["drops"]["transition"] == 0 and st["holds_out"] == 0, st
            # The last hold came after the 299th transition (the 300th ends the episode, unheld): at most half a
            # queue of those 299 was then still on its way.
            assert st["env_steps_received"] >= 299 - 8
        else:
            assert st["drops"]["transition"] > 100, st
    assert server.code == 0
    meta = ck.read_checkpoint(str(tmp_path / "root" / "b" / "weights" / "sac_latest.zip"))["meta"]
    assert (meta["env_steps"] == 300) == bool(hold_ms)


@pytest.mark.timeout(120)
def test_eval_mode_is_deterministic_and_writes_nothing(tmp_path):
    with serving(tmp_path) as server, client(server) as c:
        play(c, 5)
    weights = tmp_path / "root" / "b" / "weights"
    before = dir_digests(weights)
    assert "sac_latest.zip" in before
    with serving(tmp_path, cfg={"eval_mode": True}) as server:
        with client(server) as c:
            assert c.welcome["mode"] == "eval" and c.welcome["resumed_from"].endswith("sac_latest.zip")
            first, second = play(c, 10, seed=1), play(c, 10, seed=1)
            assert first == second  # deterministic: the same observations, the same actions
        with pytest.raises(ServerError) as e:
            client(server, "never-trained").connect()
        assert e.value.code == "bot_unavailable" and "no checkpoint" in e.value.message
    assert server.code == 0
    assert dir_digests(weights) == before
    assert not (tmp_path / "root" / "never-trained").exists()


@pytest.mark.timeout(180)
def test_two_games_at_once_each_bot_with_its_own_learner_process(tmp_path):
    with serving(tmp_path, cfg={"learner": "process", "pace": "lockstep", "learning_starts": 8}) as server:
        games = [client(server, name) for name in ("left", "right")]
        for c in games:
            c.connect()
            c.new_episode("toy")
            c.step(np.zeros(3))
        for k in range(12):  # interleaved ticks of two games on two connections
            for c in games:
                assert c.step(np.full(3, k / 12), 1.0) is not None
        bots = server.status()["bots"]
        pids = {bots[n]["learner_pid"] for n in ("left", "right")}
        assert len(pids) == 2 and os.getpid() not in pids
        assert all(bots[n]["learner"] == "process" and bots[n]["learner_steps"] == 12 - 8 + 1 for n in bots), bots
        for c in games:
            c.close()
    assert server.code == 0
    for name in ("left", "right"):
        meta = ck.read_checkpoint(str(tmp_path / "root" / name / "weights" / "sac_latest.zip"))["meta"]
        assert meta["env_steps"] == 12


@pytest.mark.timeout(180)
@pytest.mark.parametrize("learner", ["thread", "process"])
def test_a_shared_learner_trains_one_bot_on_every_games_experience_and_saves_it_once(tmp_path, learner):
    root = tmp_path / "root"
    with serving(tmp_path, shared_learner=True, cfg={"learning_starts": 8, "learner": learner}) as server:
        games = [client(server, name) for name in ("left", "right")]
        for c in games:
            c.connect()
        for k, c in enumerate(games):
            play(c, 30, seed=k)
        # Every game's transitions reach the one learner; each bot keeps its own run directory.
        wait_until(lambda: (server.status()["shared_learner"] or {}).get("env_steps_received") == 60, 30,
                   "the shared learner to take in both games' 60 transitions")
        st = server.status()
        assert st["shared_learner"]["sources"] == {"left": 0, "right": 1}
        pids = {st["bots"][n]["learner_pid"] for n in ("left", "right")}
        assert len(pids) == 1 and (pids == {os.getpid()}) == (learner == "thread"), pids  # one learner, theirs
        # Another game's spaces are refused: the shared learner learns the first bot's.
        other = client(server, "wide", obs={"shape": [4], "low": -1.0, "high": 1.0})
        with pytest.raises(ServerError) as e:
            other.connect()
        assert e.value.code == "spaces_mismatch" and "shared learner learns obs" in str(e.value)
        for c in games:
            c.close()
    assert server.code == 0
    saved = ck.read_checkpoint(str(root / "_shared" / "weights" / "sac_latest.zip"))
    assert saved["meta"]["env_steps"] == 60 and saved["meta"]["grad_steps"] > 0
    assert not (root / "left" / "weights" / "sac_latest.zip").exists()  # no bot saves a learner of its own
    assert (root / "left" / "run" / "episodes.jsonl").exists() and (root / "right" / "run" / "episodes.jsonl").exists()
    # A restarted server resumes the shared bot, and a returning game keeps its source; the server's
    # hidden (16, not given) follows the bot's 32 for every game.
    with serving(tmp_path, shared_learner=True, given=frozenset({"env"}),
                 cfg={"learning_starts": 8, "learner": learner, "hidden": 16}) as server:
        c = client(server, "right")
        assert c.connect()["settings"]["hidden"] == 32
        play(c, 5)
        assert server.status()["shared_learner"]["sources"]["right"] == 1
        c.close()
    assert ck.read_checkpoint(str(root / "_shared" / "weights" / "sac_latest.zip"))["meta"]["env_steps"] == 65


def test_a_shared_learner_refuses_lockstep(tmp_path):
    from sacbot.app.cli import _parser
    from sacbot.serve.command import serve_config

    args = _parser().parse_args(["serve", "--shared-learner", "--pace", "lockstep"])
    with pytest.raises(ConfigError, match="pace = 'lockstep' is not accepted with --shared-learner"):
        serve_config(args, env={})
    assert serve_config(_parser().parse_args(["serve", "--shared-learner", "--learner", "process"]),
                        env={}).learner == "process"


@pytest.mark.timeout(120)
def test_a_unix_socket_serves_and_is_removed_at_stop(tmp_path):
    path = str(tmp_path / "serve.sock")
    with serving(tmp_path, port=None, socket_path=path) as server:
        assert server.port is None and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with client(server) as c:
            play(c, 3)
        assert server.status()["listen"] == [f"unix {path}"]
    assert not os.path.exists(path)


@pytest.mark.timeout(180)
def test_a_served_bot_keeps_the_network_settings_it_was_trained_with_unless_they_are_given(tmp_path):
    with serving(tmp_path, cfg={"hidden": 16}) as server, client(server) as c:
        play(c, 20)
    latest = str(tmp_path / "root" / "b" / "weights" / "sac_latest.zip")
    # The server's hidden (32) was not given: the saved bot's 16 is used, and the bot resumes.
    with serving(tmp_path, given=frozenset({"env"})) as server, client(server) as c:
        assert c.welcome["resumed_from"] == latest and c.welcome["settings"]["hidden"] == 16
        play(c, 3)
    assert ck.read_checkpoint(latest)["meta"]["env_steps"] == 23
    # Given, it stays, and the bot is refused with both values named (its files kept).
    with serving(tmp_path, given=frozenset({"hidden"})) as server:
        with pytest.raises(ServerError, match="hidden = 16.*hidden = 32"):
            client(server).connect()
    assert ck.read_checkpoint(latest)["meta"]["env_steps"] == 23


@pytest.mark.timeout(120)
def test_a_disconnect_mid_episode_ends_it_and_the_same_name_continues_the_bot(tmp_path):
    with serving(tmp_path) as server:
        c = client(server)
        c.connect()
        play(c, 10, end=False)  # 10 actions, 9 outcomes: the game dies before the 10th outcome
        c.disconnect()
        wait_until(lambda: not server.status()["bots"]["b"]["connected"], 10, "the server to see the disconnect")
        agent = server.registry.get("b").agent
        assert agent.sent == 9  # nothing made up for the action whose outcome never came
        w = c.connect()
        assert w["ticks"] == 10 and w["episodes"] == 1  # the same bot, loaded all along
        assert server.status()["bots"]["b"]["episodes_cut"] == 1
        c.new_episode("toy")
        c.step(np.zeros(3))
        assert c.last["tick"] == 11 and c.last["episode"] == 1
        c.close()
        assert server.registry.get("b").agent is agent


@pytest.mark.timeout(120)
def test_a_failed_learner_ends_its_game_and_the_next_hello_starts_the_bot_again(tmp_path):
    with serving(tmp_path, cfg={"learning_starts": 8}) as server:
        c = client(server)
        c.connect()
        c.new_episode("toy")
        c.step(np.zeros(3))
        says = break_learner(server.registry.get("b").agent, "thread")
        with pytest.raises(ServerError) as e:
            for _ in range(100_000):  # the learner fails at its first update, once 8 transitions are in
                c.step(np.zeros(3), 0.0)
        assert e.value.code == "learner_failed" and says in e.value.message
        assert server.registry.get("b") is None and server.status()["learner_failures"] == 1
        w = c.connect()  # a new Agent and learner, from the newest checkpoint: the close's, here
        assert w["ticks"] == 0 and w["resumed_from"] == str(tmp_path / "root" / "b" / "weights" / "sac_latest.zip")
        assert w["episodes"] == 1
        c.close()
    assert server.code == 1  # as sacbot run, whose learner failure exits 1


@pytest.mark.timeout(120)
def test_a_bot_that_takes_long_to_load_does_not_hold_up_the_other_games(tmp_path):
    """A hello loads its bot (seconds, with a learner to start) off the loop: the loop serves the
    other games meanwhile.  Here a hello is held until the other game has played 50 steps."""
    with serving(tmp_path) as server:
        assert not server.threaded  # the default pace: the loop runs every step itself
        other = client(server, "other")
        other.connect()
        other.new_episode("toy")
        loading, release = threading.Event(), threading.Event()
        start = server.registry._start

        def slow_start(bot):
            if bot.name == "slow":
                loading.set()
                assert release.wait(60), "the test never released the slow hello"
            return start(bot)

        server.registry._start = slow_start
        slow, welcome = client(server, "slow"), {}
        t = threading.Thread(target=lambda: welcome.update(slow.connect()), name="test-slow-hello", daemon=True)
        t.start()
        try:
            assert loading.wait(60), "the slow hello never reached the bot's start"
            reward = None
            for _ in range(50):  # each step would time out (20 s) if the loop waited for the hello
                assert other.step(np.zeros(3), reward) is not None
                reward = 0.0
            assert not welcome, "the slow hello was answered before its bot had loaded"
        finally:
            release.set()
            t.join(60)
        assert welcome["type"] == "welcome" and welcome["bot"] == "slow", welcome
        assert len(play(slow, 5)) == 5
        assert other.step(np.zeros(3), 0.0) is not None
        slow.close()
        other.close()


# --- bad input: each refused with an error frame; another client keeps playing --------------------------
@pytest.fixture(scope="module", params=["learner", "lockstep"], ids=["steps-on-the-loop", "steps-on-threads"])
def guarded(tmp_path_factory, request):
    """One server for the bad-input tests: a token, short timeouts, 8 connections at most; and a
    bystander bot that must never notice.  Twice: with the default pace the server's loop runs every
    step itself; in lockstep (a step waits for the learner) each connection's messages run on a
    thread of its own."""
    tmp = tmp_path_factory.mktemp("guarded")
    with serving(tmp, token=TOKEN, idle_timeout=3.0, frame_timeout=0.5, max_connections=8,
                 cfg={"pace": request.param}) as server:
        assert server.threaded == (request.param == "lockstep")
        yield server


@pytest.fixture
def bystander(guarded):
    c = client(guarded, "bystander")
    c.connect()
    c.new_episode("toy")
    assert c.step(np.zeros(3)) is not None
    yield c
    c.close()


def ready(server, bot="bad") -> socket.socket:
    """A connection that said hello and took its episode's first step: the next step has an outcome."""
    s = raw(server)
    s.sendall(encode_frame(hello(bot)))
    assert reply(s)["type"] == "welcome"
    s.sendall(encode_frame({"type": "new_episode"}))
    assert reply(s)["type"] == "ok"
    s.sendall(encode_frame({"type": "step", "obs": [0.0, 0.0, 0.0], "reward": None}))
    assert reply(s)["type"] == "action"
    return s


def step_msg(**kw) -> dict:
    return {"type": "step", "obs": [0.1, 0.2, 0.3], "reward": 0.5, "terminated": False, "truncated": False, **kw}


BAD_FRAMES = {
    "oversized": (struct.pack(">I", 2 << 20), "frame_too_large", "2,097,152", "1,048,576"),
    "empty frame": (struct.pack(">I", 0), "bad_frame", "length 0"),
    "not msgpack": (frame(b"\xc1\xc1"), "bad_frame", "not one msgpack value"),
    "two values in one frame": (frame(msgpack.packb({"type": "close"}) + b"\x01"), "bad_frame", "ExtraData"),
    "not a map": (frame(msgpack.packb([1, 2])), "bad_frame", "a msgpack list"),
    # {"type": [[[...0...]]]} 999 deep: msgpack decodes it, and a repr of it would pass Python's recursion limit
    "a type nested 999 deep": (frame(b"\x81\xa4type" + b"\x91" * 999 + b"\x00"), "bad_frame",
                               "type = a list of 1 items"),
    "no type": (frame(msgpack.packb({"kind": "step"})), "bad_frame", "type = None"),
    "unknown type": (encode_frame({"type": "jump"}), "unknown_type", "'jump'"),
    "step before hello": (encode_frame(step_msg(reward=None)), "not_ready", "step before hello"),
    "other version": (encode_frame(hello(version=2)), "version", "protocol version 1"),
    "no token": (encode_frame(hello(token=None)), "auth", "missing"),
    "wrong token": (encode_frame(hello(token="x" * 20)), "auth", "wrong"),
    "name with a path": (encode_frame(hello(bot="../etc")), "bad_name", "'../etc'"),
    "shape as a string": (encode_frame(hello(obs_space={**OBS, "shape": "3"})), "bad_message", "shape = '3'"),
    "infinite action bound": (encode_frame(hello(action_space={**ACT, "high": [math.inf]})), "bad_message",
                              "infinite bound"),
    "2-D action space": (encode_frame(hello(action_space={"shape": [1, 1], "low": -1, "high": 1})), "bad_message",
                         "one dimension"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_a_bad_frame_gets_an_error_frame_and_others_play_on(guarded, bystander, case):
    data, code, *needles = BAD_FRAMES[case]
    s = raw(guarded)
    s.sendall(data)
    expect_error(s, code, *needles, bystander=bystander)


def test_an_observation_of_plain_numbers_is_taken_and_the_first_value_of_another_type_is_named():
    from sacbot.serve.protocol import ProtocolError, numbers

    got = numbers("step.obs", [1, 2.5, -3, np.float64(0.5)], 4)  # ints, floats, a float's subclass
    assert got.dtype == np.float64 and got.tolist() == [1.0, 2.5, -3.0, 0.5]
    for bad, named in (([0.0] * 6 + [False, 1.0], "step.obs[6] = False (bool)"),
                       ([0.0, 1.0, None], "step.obs[2] = None (NoneType)"),
                       ([0.0, [1.0], 2.0], "step.obs[1] = a list of 1 items (list)")):
        with pytest.raises(ProtocolError, match=re.escape(named)):
            numbers("step.obs", bad, len(bad))


BAD_STEPS = {
    "wrong obs size": (step_msg(obs=[1.0, 2.0]), "has 2 values; expected 3"),
    "nan in obs": (step_msg(obs=[0.0, math.nan, 0.0]), "non-finite"),
    "inf in obs": (step_msg(obs=[math.inf, 0.0, 0.0]), "non-finite"),
    "huge obs": (step_msg(obs=[1e12, 0.0, 0.0]), "above 1e+09"),
    "bool in obs": (step_msg(obs=[True, 0.0, 0.0]), "step.obs[0] = True"),
    "string in obs": (step_msg(obs=["1", 0.0, 0.0]), "step.obs[0] = '1'"),
    "nan reward": (step_msg(reward=math.nan), "reward must be finite"),
    "string reward": (step_msg(reward="1"), "reward = '1'"),
    "no reward after the first step": (step_msg(reward=None), "reward is nil"),
    "flag as a string": (step_msg(terminated="yes"), "terminated must be a bool"),
    "info not a map": (step_msg(info=[1]), "step.info is a list"),
    "won not a bool": (step_msg(info={"won": "yes"}), "info.won"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(BAD_STEPS))
def test_a_bad_step_is_refused_and_never_reaches_the_learner(guarded, bystander, case):
    msg, needle = BAD_STEPS[case]
    agent_sent = lambda: guarded.registry.get("bad").agent.sent  # noqa: E731 - transitions sent to the learner
    s = ready(guarded)
    before = agent_sent()
    s.sendall(encode_frame(msg))
    expect_error(s, "bad_message", needle, bystander=bystander)
    assert agent_sent() == before


@pytest.mark.timeout(60)
def test_the_same_step_when_valid_reaches_the_learner(guarded, bystander):
    """The control of the test above: there the count stays because the step was refused."""
    s = ready(guarded)
    before = guarded.registry.get("bad").agent.sent
    s.sendall(encode_frame(step_msg()))
    assert reply(s)["type"] == "action"
    assert guarded.registry.get("bad").agent.sent == before + 1
    s.sendall(encode_frame({"type": "close"}))
    assert reply(s)["type"] == "bye"
    s.close()


@pytest.mark.timeout(60)
def test_protocol_order_errors(guarded, bystander):
    s = ready(guarded)
    s.sendall(encode_frame(hello(obs_space={"shape": [4], "low": -1, "high": 1})))
    expect_error(s, "hello_again", "second hello", bystander=bystander)
    s = raw(guarded)
    s.sendall(encode_frame(hello()))
    assert reply(s)["type"] == "welcome"
    s.sendall(encode_frame(step_msg(reward=None)))
    expect_error(s, "not_ready", "step outside an episode", bystander=bystander)
    s = raw(guarded)
    s.sendall(encode_frame(hello()) + encode_frame({"type": "new_episode"}))  # pipelined frames are fine
    assert reply(s)["type"] == "welcome" and reply(s)["type"] == "ok"
    s.sendall(encode_frame(step_msg()))  # a reward on the first step: no action was taken yet
    expect_error(s, "bad_message", "first step of an episode", bystander=bystander)
    s = raw(guarded)
    s.sendall(encode_frame(hello(obs_space={"shape": [4], "low": -1, "high": 1})))
    expect_error(s, "spaces_mismatch", "Box(shape [3]", "Box(shape [4]", bystander=bystander)


@pytest.mark.timeout(60)
def test_two_clients_claiming_one_bot_the_second_is_refused(guarded, bystander):
    first = ready(guarded)
    second = raw(guarded)
    second.sendall(encode_frame(hello()))
    expect_error(second, "name_in_use", "'bad'", bystander=bystander)
    first.sendall(encode_frame(step_msg()))  # the first one plays on
    assert reply(first)["type"] == "action"
    first.close()


@pytest.mark.timeout(60)
def test_a_silent_client_and_a_trickling_one_time_out(guarded, bystander):
    silent = raw(guarded)
    expect_error(silent, "idle_timeout", "nothing was received for 3 s", bystander=bystander)
    slow = raw(guarded)
    slow.sendall(encode_frame(hello())[:3])  # then nothing more: one byte a second is slower still
    expect_error(slow, "frame_timeout", "0.5 s after its first byte", "(3 of", bystander=bystander)
    # A byte every 0.1 s: each byte is news, but the deadline runs from the frame's first one.
    trickle, data, done = raw(guarded), encode_frame(hello()), threading.Event()

    def drip():
        for i in range(len(data)):
            try:
                # The pace of a hostile client (not a synchronisation); it stops once the server answers.
                if done.is_set() or select.select([trickle], [], [], 0.1)[0]:
                    return
                trickle.send(data[i:i + 1])
            except (OSError, ValueError):  # closed by the server, or by the test once answered
                return

    t = threading.Thread(target=drip, name="test-trickle", daemon=True)
    t.start()
    try:
        msg = expect_error(trickle, "frame_timeout", "0.5 s after its first byte", bystander=bystander)
    finally:
        done.set()
        t.join(5)
    came = int(msg["message"].split("(")[1].split(" of")[0])
    assert 3 <= came <= 9, msg  # ~6 bytes in 0.5 s; the frame has len(data) bytes


@pytest.mark.timeout(60)
def test_pipelined_steps_are_answered_in_order(guarded, bystander):
    s = raw(guarded)
    s.sendall(encode_frame(hello("piped")))
    assert reply(s)["type"] == "welcome"
    steps = [{"type": "step", "obs": [0.0, 0.0, 0.0], "reward": None}] + [step_msg() for _ in range(5)]
    s.sendall(b"".join(encode_frame(m) for m in [{"type": "new_episode"}, *steps, {"type": "close"}]))
    assert reply(s)["type"] == "ok"
    ticks = [reply(s)["tick"] for _ in steps]
    assert ticks == list(range(ticks[0], ticks[0] + 6)), ticks
    assert reply(s)["type"] == "bye"
    s.close()


@pytest.mark.timeout(60)
def test_a_game_that_stops_reading_its_replies_is_dropped_and_others_play_on(guarded, bystander):
    """Its replies fill the socket's buffers; the server reads no more of its steps, and after
    --frame-timeout with nothing taken it lets the game go (there is no room left for an error frame)."""
    if guarded.threaded:
        pytest.skip("replies go out through the same loop in both modes, and lockstep steps (each waits for a "
                    "gradient step) take minutes to fill the socket buffers")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # small buffers fill fast
    s.settimeout(20)
    s.connect(("127.0.0.1", guarded.port))
    s.sendall(encode_frame(hello("deaf")))
    assert reply(s)["type"] == "welcome"
    s.sendall(encode_frame({"type": "new_episode"}) + encode_frame({"type": "step", "obs": [0.0] * 3, "reward": None}))
    assert reply(s)["type"] == "ok" and reply(s)["type"] == "action"
    burst = encode_frame(step_msg()) * 50
    s.settimeout(0.05)
    sent = 0
    while guarded.registry.get("deaf").peer is not None:  # released when the server drops the connection
        try:
            s.sendall(burst)  # and never a read
            sent += 50
        except TimeoutError:  # the server has stopped reading this game: its buffers are full too
            pass
        except OSError:  # reset: dropped
            break
        assert bystander.step(np.zeros(3), 0.0) is not None
        assert sent < 1_000_000, "the server never stopped taking this game's steps"
    wait_until(lambda: guarded.registry.get("deaf").peer is None, 20, "the deaf game's bot to be released")
    assert guarded.registry.get("deaf").disconnects == 1
    assert bystander.step(np.zeros(3), 0.0) is not None
    s.close()


def _random_value(r, depth=0):
    k = r.randrange(9 if depth < 4 else 7)
    if k == 7:
        return [_random_value(r, depth + 1) for _ in range(r.randrange(4))]
    if k == 8:
        return {str(r.randrange(5)): _random_value(r, depth + 1) for _ in range(r.randrange(3))}
    return [None, True, r.randint(-2**63, 2**63 - 1), r.uniform(-1e300, 1e300), "x" * r.randrange(50),
            b"\xff" * r.randrange(5), math.nan][k]


@pytest.mark.timeout(120)
def test_random_bytes_and_messages_get_only_specific_refusals_and_the_loop_serves_on(tmp_path):
    """300 connections of random input, seeded: raw bytes, random frames, and protocol messages with
    fields replaced by random values.  No refusal is an ``internal`` error (a fault of ours), and
    another game steps after each connection."""
    import random

    r = random.Random(7)
    token_free = [{"type": "hello", "version": PROTOCOL_VERSION, "bot": "f", "obs_space": OBS, "action_space": ACT},
                  {"type": "new_episode", "opponent": "o"}, step_msg(), step_msg(reward=None), {"type": "close"}]
    codes: dict[str, int] = {}
    with serving(tmp_path, idle_timeout=2.0, frame_timeout=0.5) as server:
        other = client(server, "other")
        other.connect()
        other.new_episode("toy")
        assert other.step(np.zeros(3)) is not None
        for _ in range(300):
            frames = []
            for _ in range(r.randrange(1, 6)):
                kind = r.randrange(4)
                if kind == 0:
                    frames.append(r.randbytes(r.randrange(1, 40)))
                elif kind == 1:
                    frames.append(frame(msgpack.packb(_random_value(r))))
                else:
                    m = dict(r.choice(token_free))
                    for _ in range(r.randrange(3)):
                        m[r.choice([*m, "info", "terminated", "x"])] = _random_value(r)
                    frames.append(frame(msgpack.packb(m)))
            s = raw(server)
            try:
                s.sendall(b"".join(frames))
                s.shutdown(socket.SHUT_WR)  # the server answers what came, then sees the end
                reader = FrameReader(s)
                while True:
                    msg = decode_body(reader.read(idle_timeout=10, frame_timeout=10))
                    if msg["type"] == "error":
                        codes[msg["code"]] = codes.get(msg["code"], 0) + 1
            except (ConnectionError, PeerClosed):
                pass  # the server closed after its error frame, or after the game's end
            finally:
                s.close()
            assert other.step(np.zeros(3), 0.0) is not None
        assert server.loop.links and server._threads[0].is_alive()
    assert "internal" not in codes, codes
    assert {"bad_frame", "bad_message"} <= set(codes), codes  # the random input was refused, and for its faults


@pytest.mark.timeout(90)
def test_200_connections_at_once_past_the_limit_get_an_error_frame(guarded, bystander):
    wait_until(lambda: guarded.status()["connections"] == 1, 20, "only the bystander to be connected")
    socks = [socket.socket() for _ in range(200)]
    try:
        for s in socks:
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", guarded.port))
        sel = selectors.DefaultSelector()
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        refused = 0
        while refused < 193:  # 8 connections at most, the bystander's one of them
            events = sel.select(timeout=0.05)
            assert bystander.step(np.zeros(3), 0.0) is not None  # plays on through the flood
            for key, _ in events:
                sel.unregister(key.fileobj)
                key.fileobj.setblocking(True)
                msg = reply(key.fileobj, timeout=5)
                assert msg["code"] == "too_many_connections" and "--max-connections" in msg["message"], msg
                refused += 1
        assert not sel.select(timeout=0.2)  # the 7 admitted ones got nothing: they have not said hello
        sel.close()
    finally:
        for s in socks:
            s.close()
    assert guarded.status()["refused_connections"] >= 193
    assert bystander.step(np.zeros(3), 0.0) is not None


# --- the server as a process ---------------------------------------------------------------------------
def clean_env(**extra) -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("SACBOT_", "SACLSTM_"))}, **extra}


def start_server(tmp_path, *args) -> tuple[subprocess.Popen, StderrWatcher, int]:
    p = subprocess.Popen(SACBOT + ["serve", "--root", str(tmp_path / "root"), *SMALL, *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=tmp_path)
    watch = StderrWatcher(p)
    line = watch.wait_line("listening on", 60)
    port = int(line.split("127.0.0.1:")[1].split()[0]) if "127.0.0.1:" in line else 0
    return p, watch, port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(240)
def test_kill_9_leaves_a_checkpoint_that_verifies_and_a_restarted_server_resumes(tmp_path):
    port = free_port()
    args = ["--port", str(port), "--pace", "lockstep", "--save-interval", "10"]
    p, watch, _ = start_server(tmp_path, *args)
    latest = tmp_path / "root" / "b" / "weights" / "sac_latest.zip"
    try:
        c = SacbotClient("b", OBS, ACT, port=port, timeout=30, hello_timeout=120, connect_for=60)
        c.connect()
        for k in range(5):  # 100 transitions: 37 gradient steps, saves at 10, 20 and 30
            play(c, 20, seed=k)
        # Saves are offered at steps 10, 20 and 30; one that finds the writer busy is dropped, never the first.
        wait_until(lambda: ck.read_checkpoint(str(latest))["manifest"]["step"] >= 10, 60, "a periodic save")
        p.kill()
        p.wait(timeout=30)
    finally:
        p.kill()
    assert p.returncode == -signal.SIGKILL
    inspect = subprocess.run(SACBOT + ["inspect", str(latest)], capture_output=True, text=True, timeout=60,
                             env=clean_env())
    assert inspect.returncode == 0 and "valid sacbot checkpoint" in inspect.stdout, inspect.stdout
    saved = ck.read_checkpoint(str(latest))["meta"]

    # The client retries (with backoff) while the server restarts; the bot resumes from that file.
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(c.connect()), name="test-reconnect", daemon=True)
    with pytest.raises(ConnectionError):
        c.step(np.zeros(3), 0.0)  # the old connection is gone
    t.start()
    p, watch, _ = start_server(tmp_path, *args)
    try:
        t.join(120)
        assert got["resumed_from"] == str(latest) and got["episodes"] == saved["episodes"]
        play(c, 3)
        c.close()
        status = subprocess.run(SACBOT + ["status", str(tmp_path / "root")], capture_output=True, text=True,
                                timeout=60, env=clean_env())
        assert status.returncode == 0 and "bot b" in status.stdout and f"127.0.0.1:{port}" in status.stdout, \
            status.stdout
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        p.kill()
    err = watch.rest(10)
    assert p.returncode == 0, err
    assert "SIGTERM" in err and "bot b:" in err
    final = ck.read_checkpoint(str(latest))["meta"]
    assert final["episodes"] == saved["episodes"] + 1 and final["env_steps"] == saved["env_steps"] + 3


@pytest.mark.timeout(180)
def test_out_of_file_descriptors_the_server_waits_to_accept_and_serves_its_games_meanwhile(tmp_path):
    """A flood of connections beyond the process's descriptor limit: accept fails (EMFILE), the
    server says so once, pauses accepting and goes on serving the connected game; once the flood
    is gone, a new game connects and plays."""
    import resource

    port = free_port()
    p = subprocess.Popen(SACBOT + ["serve", "--root", str(tmp_path / "root"), "--port", str(port), *SMALL,
                                   "--max-connections", "1000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=tmp_path,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96)))
    watch = StderrWatcher(p)
    flood: list[socket.socket] = []
    try:
        watch.wait_line("listening on", 60)
        c = SacbotClient("b", OBS, ACT, port=port, timeout=20, hello_timeout=120, connect_for=10)
        c.connect()
        c.new_episode("toy")
        assert c.step(np.zeros(3)) is not None
        for _ in range(150):  # more than the descriptors left; the rest wait in the backlog
            s = socket.socket()
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            flood.append(s)
            assert c.step(np.zeros(3), 0.0) is not None
        watch.wait_line("accept failed", 30)
        for _ in range(50):  # still served while the server cannot accept
            assert c.step(np.zeros(3), 0.0) is not None
        for s in flood:
            s.close()
        flood.clear()
        late = SacbotClient("late", OBS, ACT, port=port, timeout=20, hello_timeout=120, connect_for=10)
        late.connect()  # accepted once descriptors are free again
        assert len(play(late, 5)) == 5
        late.close()
        c.close()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        for s in flood:
            s.close()
        p.kill()
    err = watch.rest(10)
    assert p.returncode == 0, err
    assert err.count("accept failed") <= 2 and "ulimit -n" in err, err[-3000:]


@pytest.mark.parametrize("args,needle", [
    (["--host", "0.0.0.0"], "--allow-remote"),
    (["--host", "0.0.0.0", "--allow-remote"], "needs a token of at least 16 characters"),
    (["--host", "0.0.0.0", "--allow-remote", "--token", "short"], "got 5 characters"),
    (["--steps", "100"], "the games decide how long"),
    (["--weights-path", "w"], "each bot lives under --root"),
    (["--pace", "realtime"], "each game keeps its own clock"),
    (["--port", "70000"], "--port = 70000"),
    (["--hold-ms", "-1"], "--hold-ms = -1"),
    (["--hold-ms", "20", "--shared-learner"], "never held for a learner that every game feeds"),
])
@pytest.mark.timeout(60)
def test_refused_settings_exit_2_before_anything_is_written(tmp_path, args, needle):
    p = subprocess.run(SACBOT + ["serve", "--root", str(tmp_path / "root"), *args], capture_output=True, text=True,
                       timeout=50, env=clean_env(), cwd=tmp_path)
    assert p.returncode == 2 and "configuration error" in p.stderr and needle in p.stderr, p.stderr
    assert not (tmp_path / "root").exists()


def test_the_acting_side_of_serve_imports_no_torch():
    code = ("import sys, sacbot.serve.server, sacbot.serve.client, sacbot.serve.command, sacbot.app.cli; "
            "sacbot.app.cli._parser(); assert 'torch' not in sys.modules, 'torch was imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr

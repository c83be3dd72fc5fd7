"""``sacbot export``: a trained bot's actor out of sacbot, for a game that loads it itself.

    sacbot export weights/sac_latest.zip bot/          # actor.onnx, actor_int8.onnx, actor.safetensors, actor.json
    sacbot export weights/sac_latest.zip bot/ --zip    # and bot.zip: the checkpoint without its replay

``actor.onnx`` computes exactly what sacbot's numpy policy computes (sacbot/acting/policy.py):
the dequantized int8 weights, the activations' fake quantization (divide, clip, round half to
even, as the learner trained), the LSTM with its state as explicit inputs and outputs, and the
deterministic action ``tanh(mean)``, plus that action scaled to the env's bounds.  The
``actor_int8.onnx`` variant runs the quantized layers through QuantizeLinear/DequantizeLinear
nodes on the int8 weights themselves.  ``actor.json`` says what the inputs are (the observation
as the networks see it, with the previous reward appended where the bot trained so), the sizes,
the bounds and the names; docs/export.md shows a game loop that loads them.

Building the graphs needs the ``onnx`` package and the safetensors file ``safetensors`` (the
``export`` extra); torch is not needed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from sacbot.acting.policy import ActorParams, Linear, build_params

OPSET = 17
FILES = ("actor.onnx", "actor_int8.onnx", "actor.safetensors", "actor.json")
INPUTS = ("obs", "h", "c", "prev_act")
OUTPUTS = ("action", "env_action", "h_out", "c_out")


class ExportError(Exception):
    """What stops an export that is not a bad argument: a checkpoint that cannot be read, a file
    that cannot be written (exit 1)."""


@dataclass(frozen=True)
class ExportArgs:
    checkpoint: str
    out_dir: str
    force: bool = False  # replace files an earlier export wrote there
    zip: bool = False  # also bot.zip: the checkpoint without its replay buffer


def check(a: ExportArgs) -> None:
    """Bad arguments, before anything is read or written: ValueError naming them."""
    if not os.path.isfile(a.checkpoint):
        raise ValueError(f"CHECKPOINT {a.checkpoint!r} " + ("is a directory: name the checkpoint file in it, e.g. "
                                                          f"{os.path.join(a.checkpoint, 'sac_latest.zip')!r}"
                                                          if os.path.isdir(a.checkpoint) else "does not exist"))
    if not a.out_dir.strip():
        raise ValueError("OUT_DIR is empty: name the directory to write, e.g. bot/")
    if os.path.exists(a.out_dir) and not os.path.isdir(a.out_dir):
        raise ValueError(f"OUT_DIR {a.out_dir!r} is a file: expected a directory (made if missing)")
    names = FILES + (("bot.zip",) if a.zip else ())
    there = [n for n in names if os.path.lexists(os.path.join(a.out_dir, n))]
    if there and not a.force:
        raise ValueError(f"{a.out_dir!r} already holds {', '.join(there)}: pass --force to replace them "
                         "(nothing was written)")
    if a.zip and os.path.exists(a.checkpoint) and os.path.exists(os.path.join(a.out_dir, "bot.zip")) \
            and os.path.samefile(a.checkpoint, os.path.join(a.out_dir, "bot.zip")):
        raise ValueError(f"{a.checkpoint!r} is OUT_DIR/bot.zip itself: --force would replace the bot with its "
                         "own copy less the replay; write the export elsewhere (nothing was written)")


def export(a: ExportArgs) -> str:
    """Write the files; the line to print.  ValueError: a bad argument; ImportError: the export
    extra is missing; ExportError: what else stops it."""
    check(a)
    import onnx  # noqa: F401 - the extra's absence is said before anything is read
    import safetensors.numpy  # noqa: F401

    from sacbot.store.checkpoint import CheckpointError, read_checkpoint

    try:
        ckpt = read_checkpoint(a.checkpoint, entries=("actor",))
    except (CheckpointError, OSError) as e:
        raise ExportError(f"cannot read {a.checkpoint}: {e}") from None
    arrays = {k[len("export."):]: v for k, v in ckpt["arrays"].items() if k.startswith("export.")}
    manifest = ckpt["manifest"]
    try:
        params = build_params(arrays)
    except (KeyError, ValueError) as e:
        raise ExportError(f"{a.checkpoint} holds no actor sacbot can export: {e}") from None
    spaces, config = manifest.get("spaces") or {}, manifest.get("config") or {}
    low, high = _bounds(spaces, config, params.act_dim, a.checkpoint)
    info = _description(params, manifest, low, high)
    try:
        os.makedirs(a.out_dir, exist_ok=True)
        with _unless_a_bot_writes_there(a.out_dir):
            _write(a, params, arrays, info, low, high)
            zipped = _zip(a) if a.zip else ""
    except OSError as e:  # each file lands whole or not at all (a rename from a temp directory beside it)
        raise ExportError(f"cannot write into {a.out_dir!r}: {e.strerror or e}") from None
    return (f"{a.out_dir}: {', '.join(FILES)}{zipped} (step {manifest.get('step')}, env {config.get('env')}, "
            f"obs {params.obs_dim}, actions {params.act_dim}, hidden {params.hidden})")


@contextmanager
def _unless_a_bot_writes_there(directory: str):
    """A weights directory (it holds sacbot's lock file) is written into only while no bot holds
    it: the export could be that bot's own files' neighbour, or replace them."""
    from sacbot.store.lock import LOCK_NAME, LockHeld, WriterLock

    if not os.path.exists(os.path.join(directory, LOCK_NAME)):
        yield
        return
    try:
        lock = WriterLock(directory).acquire()
    except LockHeld as e:
        raise ExportError(f"{e}; nothing was written") from None
    try:
        yield
    finally:
        lock.close()


def _write(a: ExportArgs, params: ActorParams, arrays: dict, info: dict, low: np.ndarray, high: np.ndarray) -> None:
    import safetensors.numpy

    with tempfile.TemporaryDirectory(dir=a.out_dir, prefix=".export-") as tmp:
        onnx_save(actor_graph(params, low, high, int8=False, arrays=arrays), os.path.join(tmp, "actor.onnx"))
        onnx_save(actor_graph(params, low, high, int8=True, arrays=arrays), os.path.join(tmp, "actor_int8.onnx"))
        safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                                    os.path.join(tmp, "actor.safetensors"),
                                    metadata={"format": "sacbot actor export", "sizes": json.dumps(info["sizes"])})
        check = _self_check(params, tmp)
        if check is not None:
            info["check"] = check
        with open(os.path.join(tmp, "actor.json"), "w") as fh:
            json.dump(info, fh, indent=1)
        # Each file lands whole or not at all: a rename within OUT_DIR.
        for name in FILES:
            os.chmod(os.path.join(tmp, name), 0o644)  # as any file the user writes, not a temp file's 0600
            os.replace(os.path.join(tmp, name), os.path.join(a.out_dir, name))


def _bounds(spaces: dict, config: dict, act_dim: int, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The action bounds env_action scales to: the manifest's, or (files of formats 1 and 2 did
    not record them) the bounds of the env the bot trained in, made from its id and kwargs."""
    if "action_low" in spaces and "action_high" in spaces:
        return np.asarray(spaces["action_low"], np.float32), np.asarray(spaces["action_high"], np.float32)
    from sacbot.acting.errors import AgentError
    from sacbot.acting.games import make_env

    try:
        env = make_env(config["env"], kwargs=json.loads(config.get("env_kwargs") or "{}"))
    except (KeyError, AgentError, ValueError) as e:
        raise ExportError(f"{path} does not record its action bounds, and its env cannot be made to read them "
                          f"({e}); re-save it with this sacbot (sacbot run --steps 1 resumes and saves it)") from None
    try:
        low, high = (np.asarray(b, np.float32).reshape(-1) for b in (env.action_space.low, env.action_space.high))
    finally:
        env.close()
    if low.shape != (act_dim,):
        raise ExportError(f"{path}'s env {config['env']} has {low.size} action values; its actor has {act_dim}")
    return low, high


def _self_check(params: ActorParams, tmp: str, n: int = 200) -> dict | None:
    """Both graphs against the numpy policy on ``n`` random observations and states (onnxruntime
    installed): the largest difference of action, h and c.  A graph that disagrees is a bug of
    this exporter: refused, nothing written.  None without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from sacbot.acting import policy

    rng = np.random.default_rng(0)
    cases = [(rng.uniform(-1, 1, params.obs_dim).astype(np.float32),
              policy.PolicyState(*(rng.normal(0, 0.5, k).astype(np.float32)
                                   for k in (params.hidden, params.hidden)),
                                 rng.uniform(-1, 1, params.act_dim).astype(np.float32))) for _ in range(n)]
    worst = {}
    for name in ("actor.onnx", "actor_int8.onnx"):
        s = ort.InferenceSession(os.path.join(tmp, name), providers=["CPUExecutionProvider"])
        d = 0.0
        for x, st in cases:
            a, nxt = policy.act(params, x, st)
            feed = {"obs": x[None], "h": st.h[None], "c": st.c[None], "prev_act": st.prev_act[None]}
            got, _, h, c = s.run(None, feed)
            d = max(d, float(np.abs(got[0] - a).max()), float(np.abs(h[0] - nxt.h).max()),
                    float(np.abs(c[0] - nxt.c).max()))
        if d > 1e-3:
            raise ExportError(f"{name} differs from sacbot's policy by {d:.3g} on random inputs; expected under 1e-3: "
                              "nothing was written (a bug of the exporter: please report it)")
        worst[name] = float(f"{d:.3g}")
    return {"random_inputs": n, "max_abs_difference": worst, "onnxruntime": ort.__version__}


def onnx_save(model, path: str) -> None:
    import onnx

    onnx.checker.check_model(model)
    onnx.save(model, path)


def _description(params: ActorParams, manifest: dict, low: np.ndarray, high: np.ndarray) -> dict:
    from sacbot import __version__

    config = manifest.get("config") or {}
    return {
        "format": "sacbot actor export 1",
        "sacbot_version": __version__,
        "env": config.get("env"), "env_kwargs": config.get("env_kwargs") or "",
        "step": manifest.get("step"),
        "sizes": {"obs": params.obs_dim, "actor_obs": params.n_obs, "action": params.act_dim, "hidden": params.hidden},
        "obs": ("the observation flattened to float32 (row-major), then the previous tick's reward (0 at an "
                "episode's start) as one more value"
                + (", as sign(r) * ln(1 + |r|)" if config.get("reward_input_squash") == "symlog" else "")
                if config.get("reward_input") else
                "the observation flattened to float32 (row-major)")
               + (f"; the actor reads its first {params.n_obs} values (the rest are the critic's alone)"
                  if params.n_obs < params.obs_dim else ""),
        "reward_input": bool(config.get("reward_input")),
        "reward_input_squash": str(config.get("reward_input_squash") or "off"),
        "memoryless": bool(config.get("memoryless")),
        "inputs": {"obs": ["batch", params.obs_dim], "h": ["batch", params.hidden], "c": ["batch", params.hidden],
                   "prev_act": ["batch", params.act_dim]},
        "outputs": {"action": ["batch", params.act_dim], "env_action": ["batch", params.act_dim],
                    "h_out": ["batch", params.hidden], "c_out": ["batch", params.hidden]},
        "state": ("h, c and prev_act start at zeros at every episode's start; each tick feed back h_out, c_out "
                  "and action (not env_action) as the next h, c and prev_act"
                  + ("; this bot is memoryless: zeros every tick" if config.get("memoryless") else "")),
        "action_low": low.tolist(), "action_high": high.tolist(),
        "action_scaling": "env_action = action_low + (action + 1) * (action_high - action_low) / 2",
        "policy": "deterministic: action = tanh(mean of the actor's Gaussian), as sacbot eval plays",
        "files": {"actor.onnx": "float32 ops on the dequantized weights with the activations' fake quantization: "
                                "sacbot's numpy policy exactly",
                  "actor_int8.onnx": "QuantizeLinear/DequantizeLinear on the int8 weights (docs/export.md gives "
                                     "its measured difference)",
                  "actor.safetensors": "the actor's arrays as sacbot exports them (int8 weights, per-row scales, "
                                       "input scales and ranges)"},
    }


def _zip(a: ExportArgs) -> str:
    """bot.zip: the checkpoint without its replay (the model, optimizer, counters, RNG states and
    actor export), verified after it is written."""
    from sacbot.store import checkpoint as ck

    try:
        full = ck.read_checkpoint(a.checkpoint)
    except ck.CheckpointError as e:
        raise ExportError(f"cannot read {a.checkpoint} whole for bot.zip: {e}") from None
    arrays = {k: v for k, v in full["arrays"].items() if not k.startswith("replay.")}
    meta = {k: v for k, v in full["meta"].items() if k != "replay"}
    m = full["manifest"]
    dst = os.path.join(a.out_dir, "bot.zip")
    try:
        with tempfile.TemporaryDirectory() as d:
            ck.write_checkpoint(d, {"arrays": arrays, "meta": meta}, keep_last=0, config=m.get("config"),
                                spaces=m.get("spaces"))
            with open(os.path.join(d, ck.LATEST), "rb") as src:
                ck.atomic_write(dst, lambda fh: shutil.copyfileobj(src, fh, 1 << 20))
    except OSError as e:
        raise ExportError(f"cannot write {dst!r}: {e.strerror or e}; bot.zip was not written") from None
    ck.read_checkpoint(dst)  # verify what was written
    return ", bot.zip"


# --- the graph ----------------------------------------------------------------------------------
_FLOAT = 1  # onnx.TensorProto.FLOAT, without importing onnx where the module loads


class _Builder:
    """Nodes and initializers of one graph, with fresh names."""

    def __init__(self):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def const(self, value, name: str = "k") -> str:
        self.n += 1
        full = f"{name}_{self.n}"
        self.inits.append(self.numpy_helper.from_array(np.asarray(value), full))
        return full

    def op(self, kind: str, *inputs: str, out: str | None = None, **attrs) -> str:
        self.n += 1
        out = out or f"{kind.lower()}_{self.n}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attrs))
        return out


def _quantize(b: _Builder, x: str, scale: np.float32, lo: float, hi: float, int8: bool) -> str:
    """The activation quantization the learner trained with: round(clip(x / s, lo, hi)), as
    integers in float32 (fp32 graph), or as int8/uint8 through QuantizeLinear (int8 graph)."""
    if not int8:
        q = b.op("Div", x, b.const(np.float32(scale), "x_scale"))
        q = b.op("Clip", q, b.const(np.float32(lo), "lo"), b.const(np.float32(hi), "hi"))
        return b.op("Round", q)
    # QuantizeLinear saturates to its type's range; the trained range may be narrower ([-127, 127]).
    x = b.op("Clip", x, b.const(np.float32(lo * scale), "lo"), b.const(np.float32(hi * scale), "hi"))
    zero = np.uint8(0) if lo >= 0 else np.int8(0)
    return b.op("QuantizeLinear", x, b.const(np.float32(scale), "x_scale"), b.const(zero, "zero"))


def _linear(b: _Builder, x: str, layer: Linear, int8: bool, w_int=None, w_scale=None) -> str:
    """x @ W.T + b for row vectors, as policy._apply computes it."""
    if layer.x_scale is None:
        return b.op("Add", b.op("MatMul", x, b.const(layer.w.T.copy(), "w_t")), b.const(layer.b, "b"))
    q = _quantize(b, x, layer.x_scale, layer.x_lo, layer.x_hi, int8)
    if not int8:  # integer-valued q and w: the products and sums are exact in float32
        y = b.op("MatMul", q, b.const(layer.w.T.copy(), "w_t"))
    else:  # int8 weights times the quantized input, summed in int32: exact too
        y = b.op("Cast", b.op("MatMulInteger", q, b.const(np.ascontiguousarray(w_int.T), "w_int8_t")),
                 to=_FLOAT)
    return b.op("Add", b.op("Mul", y, b.const(layer.out_scale, "out_scale")), b.const(layer.b, "b"))


def actor_graph(params: ActorParams, low: np.ndarray, high: np.ndarray, int8: bool, arrays: dict):
    """The actor's one step as an ONNX model: (obs, h, c, prev_act) -> (action, env_action,
    h_out, c_out), a dynamic batch dimension first."""
    from onnx import TensorProto, helper

    b = _Builder()
    p = params
    obs = "obs"
    if p.n_obs < p.obs_dim:
        obs = b.op("Slice", "obs", b.const(np.array([0], np.int64)), b.const(np.array([p.n_obs], np.int64)),
                   b.const(np.array([1], np.int64)))
    x = b.op("Concat", obs, "prev_act", axis=1)

    def layer(name: str, inp: str, lin: Linear) -> str:
        if int8 and lin.x_scale is not None:
            return _linear(b, inp, lin, True, arrays[f"{name}.w"], arrays[f"{name}.w_scale"])
        return _linear(b, inp, lin, False)

    z = b.op("Relu", layer("fc1", x, p.fc1))
    cell = p.lstm
    if cell.x_scale is not None:  # the LSTM reads the fake-quantized input, dequantized
        z = b.op("Mul", _quantize(b, z, cell.x_scale, cell.x_lo, cell.x_hi, False),
                 b.const(np.float32(cell.x_scale), "x_scale"))
    # The cell in float64, rounded to float32 once, as the numpy policy computes it: then both
    # round to the same state whatever order their sums take (sacbot/acting/policy.py).
    double = TensorProto.DOUBLE
    z64, h64, c64 = (b.op("Cast", v, to=double) for v in (z, "h", "c"))
    gi = b.op("Add", b.op("MatMul", z64, b.const(cell.w_ih.T.copy(), "w_ih_t")), b.const(cell.b_ih, "b_ih"))
    gh = b.op("Add", b.op("MatMul", h64, b.const(cell.w_hh.T.copy(), "w_hh_t")), b.const(cell.b_hh, "b_hh"))
    gates = b.op("Add", gi, gh)
    i, f, g, o = (f"gate_{k}" for k in "ifgo")
    b.nodes.append(helper.make_node("Split", [gates, b.const(np.array([p.hidden] * 4, np.int64), "split")],
                                    [i, f, g, o], axis=1))
    c_new = b.op("Add", b.op("Mul", b.op("Sigmoid", f), c64), b.op("Mul", b.op("Sigmoid", i), b.op("Tanh", g)))
    h_out = b.op("Cast", b.op("Mul", b.op("Sigmoid", o), b.op("Tanh", c_new)), to=TensorProto.FLOAT, out="h_out")
    b.op("Cast", c_new, to=TensorProto.FLOAT, out="c_out")
    y = b.op("Relu", layer("fc2", h_out, p.fc2))
    out = layer("head", y, p.head)
    mean = b.op("Slice", out, b.const(np.array([0], np.int64)), b.const(np.array([p.act_dim], np.int64)),
                b.const(np.array([1], np.int64)))
    action = b.op("Tanh", mean, out="action")
    half = ((high - low) / 2).astype(np.float32)
    scaled = b.op("Mul", b.op("Add", action, b.const(np.float32(1.0), "one")), b.const(half, "half"))
    b.op("Add", b.const(low, "low"), scaled, out="env_action")

    def tensor(name: str, size: int):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", size])

    graph = helper.make_graph(
        b.nodes, "sacbot_actor" + ("_int8" if int8 else ""),
        [tensor("obs", p.obs_dim), tensor("h", p.hidden), tensor("c", p.hidden), tensor("prev_act", p.act_dim)],
        [tensor("action", p.act_dim), tensor("env_action", p.act_dim), tensor("h_out", p.hidden),
         tensor("c_out", p.hidden)], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sacbot")
    model.ir_version = 8  # what onnxruntime releases from 1.14 on read
    return model

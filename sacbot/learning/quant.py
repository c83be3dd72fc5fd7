"""Quantization-aware layers: LSQ fake quantization for a linear layer and an LSTM.

Pipeline: *calibrating* (fp32 forward, input ranges observed)
-> *quantizing* (fake-quant forward, learned scales) -> export (int8 + scales).
``off`` keeps plain fp32 throughout, for comparison.

Two tricks keep the numpy actor in :mod:`sacbot.acting.policy` in step with these layers:

* A quantized linear layer multiplies the *integer* tensors, ``q_x @ q_w.T``, and
  applies ``s_x * s_w`` afterwards.  Integer-valued float32 products and sums are
  exact while ``in_features * Qx * Qw < 2**24``, so torch and numpy get the same bits
  whatever order their BLAS sums in.  Mathematically this is the same as
  ``(q_x s_x) @ (q_w s_w).T``, so autograd yields the LSQ gradients unchanged.
* The straight-through estimator and the LSQ gradient scale are custom autograd
  Functions: their forward values are exactly ``round(clamp(x/s))`` and ``exp(log_s)``,
  so an exported scale and integer weight equal the ones used in training.

Training runs each layer's quantization as one autograd node with a written-out
backward (``_QLinearFn``, ``_FakeQuantFn``), because per-op overhead dominates at these
sizes.  Their forwards run the same ops as the composable pieces,
``LsqQuantizer.scale()`` and ``integer()``; export uses those pieces, and a test checks
the fused gradients against autograd through them.

The LSTM takes the "fused kernel" route: weights and the layer input are fake-quantized,
then ``torch.lstm`` runs the recurrence in C++.  The recurrent state h, c is not quantized,
so a Python loop over time is never needed; docs/experiments.md ("Learner speed") has the
measurement behind that choice.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Phases, stored as an int buffer so they travel with the learner state.
OFF, CALIBRATING, QUANTIZING = 0, 1, 2
# What status and metrics say: "off" is a plain fp32 actor; "calibrating" observes each layer's
# input range in fp32 for the first calib_updates updates; "training" is quantization-aware
# training: every forward pass quantizes and dequantizes weights and inputs, and the scales are
# learned with LSQ, so the int8 export computes what the learner's actor computes.
PHASE_NAMES = {OFF: "off", CALIBRATING: "calibrating", QUANTIZING: "training"}

# log-scale floor: exp(-20) ~ 2e-9 keeps every scale strictly positive and x/s finite,
# even if an optimizer drives the log-scale without bound.
_LOG_SCALE_MIN = -20.0


def qrange(bits: int, signed: bool) -> tuple[int, int]:
    """(Qn, Qp): the integer grid is [-Qn, Qp].  Signed grids are symmetric, so 8 bits
    gives [-127, 127] and fits int8; unsigned inputs (after a ReLU) use [0, 2**b - 1]."""
    if signed:
        q = 2 ** (bits - 1) - 1
        return q, q
    return 0, 2**bits - 1


def _scale(log_s: torch.Tensor) -> torch.Tensor:
    """The step size from its learned log: exp(max(log_s, floor)), always > 0."""
    return log_s.clamp(min=_LOG_SCALE_MIN).exp()


def _round_clip(v: torch.Tensor, qn: int, qp: int) -> torch.Tensor:
    """round(clamp(v, -Qn, Qp)): the integer grid point.  Every quantizer here goes through
    these same ops, so the fused training layers and export agree bit for bit."""
    return v.clamp(-qn, qp).round()


class _LsqScale(torch.autograd.Function):
    """s = exp(max(log_s, floor)) forward; LSQ-scaled gradient backward.

    LSQ (Esser et al. 2020, eq. 4) multiplies the step-size gradient by
    g = 1/sqrt(N * Qp) so it stays commensurate with the weight updates.  One
    Function instead of five autograd ops.
    """

    @staticmethod
    def forward(ctx, log_s, g: float):
        s = _scale(log_s)
        ctx.save_for_backward(s, log_s)
        ctx.g = g
        return s

    @staticmethod
    def backward(ctx, grad):
        s, log_s = ctx.saved_tensors
        return _lsq_scale_grad(grad, s, log_s, ctx.g), None


class _FakeQuantInt(torch.autograd.Function):
    """q = round(clamp(x / s, -Qn, Qp)) as an integer-valued float tensor.

    Backward is the straight-through estimator: inside the clip range round() passes
    the gradient of x / s unchanged (dq/dx = 1/s, dq/ds = -x/s^2); outside, q is
    constant.  Combined with the ``* s`` the caller applies, d(q s)/ds is LSQ's
    ``q - x/s`` inside and ``-Qn`` or ``Qp`` outside.
    """

    @staticmethod
    def forward(ctx, x, s, qn: int, qp: int):
        v = x / s
        ctx.save_for_backward(v, s)
        ctx.qn, ctx.qp = qn, qp
        return _round_clip(v, qn, qp)

    @staticmethod
    def backward(ctx, grad):
        v, s = ctx.saved_tensors
        # hardtanh_backward is the "inside the clip range" mask in one fused op; a
        # comparison-and-multiply costs 5x more on CPU (bool tensors are slow).
        g = torch.ops.aten.hardtanh_backward(grad, v, -ctx.qn, ctx.qp) / s
        gs = -(g * v)
        # reduce to s's shape (per tensor: a scalar; per channel: (out, 1))
        gs = gs.sum() if s.dim() == 0 else gs.sum(dim=tuple(range(1, gs.dim())), keepdim=True)
        return g, gs.view(s.shape), None, None


def _lsq_scale_grad(grad_s: torch.Tensor, s: torch.Tensor, log_s: torch.Tensor, g: float) -> torch.Tensor:
    """d loss / d log_s from d loss / d s: the chain rule through exp, the LSQ factor g,
    and zero below the floor (what ``_LsqScale.backward`` does)."""
    return grad_s * s * (log_s > _LOG_SCALE_MIN) * g


class _QLinearFn(torch.autograd.Function):
    """A quantized linear layer in one autograd node:
    ``out = (round(clamp(x/sx)) @ round(clamp(w/sw)).T) * (sx * sw) + b``.

    Its forward runs the same ops as ``_FakeQuantInt`` + ``_LsqScale`` + ``F.linear``, so
    the values (and the numpy parity) are unchanged.  The backward is written out: the same
    STE and LSQ gradients, in ~15 ops instead of ~9 autograd nodes and their bookkeeping
    (measured: this layer's forward+backward went from ~1.2 to ~0.7 ms at 528 x 128).
    """

    @staticmethod
    def forward(ctx, x, w, b, log_sx, log_sw, gx: float, gw: float, qx_range, qw_range):
        sx, sw = _scale(log_sx), _scale(log_sw)
        vx, vw = x / sx, w / sw
        qx, qw = _round_clip(vx, *qx_range), _round_clip(vw, *qw_range)
        acc = F.linear(qx, qw)
        out = acc * (sx * sw.view(-1)) + b
        ctx.save_for_backward(qx, vx, qw, vw, sx, sw, acc, log_sx, log_sw)
        ctx.gx, ctx.gw, ctx.qx_range, ctx.qw_range = gx, gw, qx_range, qw_range
        return out

    @staticmethod
    def backward(ctx, grad):
        qx, vx, qw, vw, sx, sw, acc, log_sx, log_sw = ctx.saved_tensors
        sc = sx * sw.view(-1)
        g_acc = grad * sc
        r = (grad * acc).sum(0)  # d loss / d (sx * sw), per output channel
        # STE through round(clamp(v)): pass inside the clip range, zero outside.
        mx = torch.ops.aten.hardtanh_backward(g_acc @ qw, vx, -ctx.qx_range[0], ctx.qx_range[1])
        mw = torch.ops.aten.hardtanh_backward(g_acc.t() @ qx, vw, -ctx.qw_range[0], ctx.qw_range[1])
        # d q / d s = -v / s inside the range; plus the rescale's share r.
        gsx = torch.dot(r, sw.view(-1)) - torch.dot(mx.view(-1), vx.view(-1)) / sx
        gsw = r.view(-1, 1) * sx - (mw * vw).sum(1, keepdim=True) / sw
        return (mx / sx, mw / sw, grad.sum(0), _lsq_scale_grad(gsx, sx, log_sx, ctx.gx),
                _lsq_scale_grad(gsw, sw, log_sw, ctx.gw), None, None, None, None)


class _FakeQuantFn(torch.autograd.Function):
    """``round(clamp(x/s)) * s`` with s = exp(log_s), in one autograd node: the fused
    version of ``integer(x, scale()) * scale()`` for the LSTM's input and weights."""

    @staticmethod
    def forward(ctx, x, log_s, g: float, qn: int, qp: int):
        s = _scale(log_s)
        v = x / s
        q = _round_clip(v, qn, qp)
        ctx.save_for_backward(q, v, s, log_s)
        ctx.g, ctx.qn, ctx.qp = g, qn, qp
        return q * s

    @staticmethod
    def backward(ctx, grad):
        q, v, s, log_s = ctx.saved_tensors
        m = torch.ops.aten.hardtanh_backward(grad, v, -ctx.qn, ctx.qp)  # d(qs)/dx: 1 inside
        gs = grad * q - m * v  # d(qs)/ds: q - v inside the range, q (= -Qn or Qp) outside
        gs = gs.sum() if s.dim() == 0 else gs.sum(dim=tuple(range(1, gs.dim())), keepdim=True)
        return m, _lsq_scale_grad(gs, s, log_s, ctx.g), None, None, None


class LsqQuantizer(nn.Module):
    """A learned-step-size quantizer: per tensor (shape ``()``) or per output channel."""

    def __init__(self, shape: tuple[int, ...], bits: int, signed: bool, n_features: int):
        super().__init__()
        self.bits, self.signed = bits, signed
        self.qn, self.qp = qrange(bits, signed)
        # LSQ gradient scale 1/sqrt(N * Qp): keeps the step-size update commensurate
        # with the weight updates (Esser et al. 2020, section 2.2).
        self.g = 1.0 / math.sqrt(n_features * self.qp)
        # Learned in log space so the scale is positive by construction.
        self.log_scale = nn.Parameter(torch.zeros(shape))

    def scale(self) -> torch.Tensor:
        return _LsqScale.apply(self.log_scale, self.g)

    def integer(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Integer-valued float tensor round(clamp(x / s)); STE inside the clip range."""
        return _FakeQuantInt.apply(x, s, self.qn, self.qp)

    def fake_quant(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantized round(clamp(x / s)) * s, with STE and LSQ gradients, in one node."""
        return _FakeQuantFn.apply(x, self.log_scale, self.g, self.qn, self.qp)

    @torch.no_grad()
    def init_from_range(self, max_abs: torch.Tensor) -> None:
        s = (max_abs / self.qp).clamp(min=1e-6)
        self.log_scale.copy_(s.log().expand_as(self.log_scale))


class _QuantLayer(nn.Module):
    """Shared phase handling and input-range observation for the layers below."""

    phase: torch.Tensor
    calib_max: torch.Tensor

    def _init_quant(self, in_features: int, quant: bool, bits: int, input_signed: bool) -> None:
        self.register_buffer("phase", torch.tensor(CALIBRATING if quant else OFF))
        self.register_buffer("calib_max", torch.zeros(()))
        self.bits, self.input_signed = bits, input_signed
        self.xq = LsqQuantizer((), bits, input_signed, in_features) if quant else None

    def _observe(self, x: torch.Tensor) -> None:
        with torch.no_grad():
            torch.maximum(self.calib_max, x.detach().abs().max(), out=self.calib_max)

    def weight_quantizers(self) -> list[tuple[LsqQuantizer, nn.Parameter]]:
        raise NotImplementedError

    @torch.no_grad()
    def finish_calibration(self) -> None:
        """Initialise scales from what calibration saw, then start fake quantization."""
        if int(self.phase) != CALIBRATING:
            return
        assert self.xq is not None
        self.xq.init_from_range(self.calib_max)
        for wq, w in self.weight_quantizers():
            wq.init_from_range(w.abs().amax(dim=1, keepdim=True))
        self.phase.fill_(QUANTIZING)


class QLinear(_QuantLayer):
    """Linear layer with per-output-channel weight and per-tensor input fake quantization."""

    def __init__(self, in_features: int, out_features: int, *, quant: bool, bits: int = 8,
                 input_signed: bool = True):
        super().__init__()
        ref = nn.Linear(in_features, out_features)  # PyTorch's default initialisation
        self.weight, self.bias = ref.weight, ref.bias
        self._init_quant(in_features, quant, bits, input_signed)
        self.wq = LsqQuantizer((out_features, 1), bits, True, in_features) if quant else None

    def weight_quantizers(self):
        assert self.wq is not None
        return [(self.wq, self.weight)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phase = int(self.phase)
        if phase == QUANTIZING:
            assert self.xq is not None and self.wq is not None
            xq, wq = self.xq, self.wq
            out = _QLinearFn.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias, xq.log_scale,
                                   wq.log_scale, xq.g, wq.g, (xq.qn, xq.qp), (wq.qn, wq.qp))
            return out.view(*x.shape[:-1], -1)
        if phase == CALIBRATING:
            self._observe(x)
        return F.linear(x, self.weight, self.bias)


class QLSTM(_QuantLayer):
    """Single-layer time-major (T, B, .) LSTM with fake-quantized weights and input.

    Gate order and equations are PyTorch's (i, f, g, o); the recurrent state is fp32.
    """

    def __init__(self, input_size: int, hidden_size: int, *, quant: bool, bits: int = 8,
                 input_signed: bool = True):
        super().__init__()
        ref = nn.LSTM(input_size, hidden_size)
        self.hidden_size = hidden_size
        self.weight_ih, self.weight_hh = ref.weight_ih_l0, ref.weight_hh_l0
        self.bias_ih, self.bias_hh = ref.bias_ih_l0, ref.bias_hh_l0
        self._init_quant(input_size, quant, bits, input_signed)
        if quant:
            self.wq_ih = LsqQuantizer((4 * hidden_size, 1), bits, True, input_size)
            self.wq_hh = LsqQuantizer((4 * hidden_size, 1), bits, True, hidden_size)

    def weight_quantizers(self):
        return [(self.wq_ih, self.weight_ih), (self.wq_hh, self.weight_hh)]

    def effective_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input, W_ih, W_hh) as the fused kernel sees them in the current phase."""
        phase = int(self.phase)
        if phase == QUANTIZING:
            assert self.xq is not None
            return (self.xq.fake_quant(x), self.wq_ih.fake_quant(self.weight_ih),
                    self.wq_hh.fake_quant(self.weight_hh))
        if phase == CALIBRATING:
            self._observe(x)
        return x, self.weight_ih, self.weight_hh

    def forward(self, x: torch.Tensor, hc: tuple[torch.Tensor, torch.Tensor] | None = None):
        x_in, w_ih, w_hh = self.effective_weights(x)
        if hc is None:
            z = x.new_zeros(1, x.shape[1], self.hidden_size)
            hc = (z, z)
        args = (x_in, hc, (w_ih, w_hh, self.bias_ih, self.bias_hh), True, 1, 0.0, self.training, False, False)
        if x.is_cuda and w_ih is not self.weight_ih:  # fake-quantizing, on a GPU
            # cuDNN's LSTM differs from fp32 maths by ~5e-6 (its own gate functions), enough to
            # move the next layer's quantized input across a rounding edge: 1.3e-4 off the numpy
            # actor on an H200.  PyTorch's own CUDA LSTM kernels match it to 1.5e-8, at
            # ~0.7x cuDNN's steps/s.  Unquantized, cuDNN's 5.5e-7 is within the 1e-5 asked.
            with torch.backends.cudnn.flags(enabled=False):
                out, h, c = torch.lstm(*args)
        else:
            out, h, c = torch.lstm(*args)
        return out, (h, c)

"""PyTorch equivalents of kiln's registry ops, one entry per op (torch_difftest.py fails any
op without one). An entry takes the case's input tensors and decoded attrs and returns the
outputs; ops whose values PyTorch cannot reproduce (kiln's Philox streams) have a property
check in RANDOM instead, which returns an error string or None."""
import math

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
          "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool}


def flt(x):
    """Integer and bool inputs of a floating function become f32 (kiln's promote_float)."""
    return x if x.is_floating_point() else x.to(torch.float32)


def pair(v, fallback):
    v = v or [fallback]
    return (v[0], v[0]) if len(v) == 1 else tuple(v)


def scalar_t(s, like):
    """A Python scalar as a 0-d tensor of the dtype the scalar promotes `like` to."""
    return torch.tensor(s, dtype=torch.result_type(like, s), device=like.device)


def axes_of(x, a):
    axes = a.get("axes")
    return list(range(x.dim())) if axes is None else axes


def reduce_each(fn, x, a):
    """fn over each axis in turn (torch.prod and the like take one dim)."""
    keep = a.get("keepdim", False)
    dims = sorted({d % max(x.dim(), 1) for d in axes_of(x, a)}, reverse=True)
    if x.dim() == 0:
        return fn(x, 0, keep)
    for d in dims:
        x = fn(x, d, True)
    return x if keep else x.squeeze(tuple(dims)) if dims else x


def conv_args(a):
    return dict(stride=pair(a.get("stride"), 1), padding=pair(a.get("padding"), 0),
                dilation=pair(a.get("dilation"), 1), groups=a.get("groups", 1))


def pool_args(a):
    k = pair(a["kernel"], None)
    st = pair(a.get("stride"), None) if a.get("stride") else k
    return k, st, pair(a.get("padding"), 0)


def nll(lp, labels, a):
    return F.nll_loss(lp, labels, reduction="none", ignore_index=a.get("ignore_index", -100))


def nll_backward(g, labels, a):
    shape = list(labels.shape)
    shape.insert(1, a["classes"])
    lp = torch.zeros(shape, dtype=g.dtype, device=g.device, requires_grad=True)
    return torch.autograd.grad(nll(lp, labels, a), lp, g)[0]


def exclusive_prod(x):
    """Products of the other elements along the last dim, in f64: prefix x suffix."""
    x64 = x.double().reshape(-1, x.shape[-1] if x.dim() else 1)
    one = torch.ones_like(x64[:, :1])
    prefix = torch.cat([one, torch.cumprod(x64, 1)[:, :-1]], 1)
    suffix = torch.cat([torch.cumprod(x64.flip(1), 1).flip(1)[:, 1:], one], 1)
    return (prefix * suffix).reshape(x.shape).to(flt(x).dtype)


def slice_(x, a):
    idx = [slice(None)] * x.dim()
    idx[a["axis"]] = slice(a["start"], a["stop"], a["step"])
    return x[tuple(idx)]


def arg_extreme(fn, x, a):
    """One axis, or the index into the flattened tensor; bool compares as u8, as in kiln."""
    axes = axes_of(x, a)
    x = x.to(torch.uint8) if x.dtype == torch.bool else x
    if len(axes) == 1 and x.dim() > 0:
        return fn(x, axes[0], keepdim=a.get("keepdim", False))
    return fn(x)


def unary(fn):
    return lambda x, a: fn(x)


def floating(fn):
    return lambda x, a: fn(flt(x))


def binary(fn):
    return lambda x, y, a: fn(x, y)


def with_scalar(fn):
    return lambda x, a: fn(x, a["scalar"])


OPS = {
    # activations
    "sigmoid": floating(torch.sigmoid),
    "relu": unary(torch.relu),
    "leaky_relu": lambda x, a: F.leaky_relu(flt(x), a["negative_slope"]),
    "gelu": floating(F.gelu),
    "silu": floating(F.silu),
    "softplus": floating(F.softplus),
    # comparisons and logic
    **{n: binary(getattr(torch, n)) for n in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or")},
    **{n + "_scalar": (lambda f: lambda x, a: f(x, scalar_t(a["scalar"], x)))(getattr(torch, n))
       for n in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or")},
    "logical_not": unary(torch.logical_not),
    "isnan": unary(torch.isnan),
    # convolution
    "conv2d": lambda x, w, a: F.conv2d(x, w, **conv_args(a)),
    "conv2d_grad_input": lambda g, w, a: torch.nn.grad.conv2d_input(a["input_shape"], w, g, **conv_args(a)),
    "conv2d_grad_weight": lambda x, g, a: torch.nn.grad.conv2d_weight(x, a["weight_shape"], g, **conv_args(a)),
    # creation
    "full": lambda a, dev: torch.full(a["shape"], a["value"], dtype=a["dtype"], device=dev),
    "arange": lambda a, dev: torch.arange(a["start"], a["start"] + a["shape"][0] * a["step"], a["step"],
                                          dtype=a["dtype"], device=dev),
    "linspace": lambda a, dev: torch.linspace(a["start"], a["end"], a["shape"][0], dtype=a["dtype"], device=dev),
    "eye": lambda a, dev: torch.eye(*a["shape"], dtype=a["dtype"], device=dev),
    # elementwise binary
    "pow": binary(torch.pow),
    "pow_scalar": with_scalar(torch.pow),
    "rpow_scalar": lambda x, a: torch.pow(a["scalar"], x),
    "maximum": binary(torch.maximum),
    "minimum": binary(torch.minimum),
    "maximum_scalar": lambda x, a: torch.maximum(x, scalar_t(a["scalar"], x)),
    "minimum_scalar": lambda x, a: torch.minimum(x, scalar_t(a["scalar"], x)),
    "where": lambda c, x, y, a: torch.where(c, x, y),
    "add": binary(torch.add),
    "sub": binary(torch.sub),
    "mul": binary(torch.mul),
    "div": binary(torch.div),
    "add_scalar": with_scalar(torch.add),
    "sub_scalar": with_scalar(torch.sub),
    "rsub_scalar": with_scalar(torch.rsub),
    "mul_scalar": with_scalar(torch.mul),
    "div_scalar": with_scalar(torch.div),
    "rdiv_scalar": lambda x, a: torch.div(scalar_t(a["scalar"], x), x),
    "neg": unary(torch.neg),
    # elementwise unary
    **{n: unary(getattr(torch, n)) for n in ("abs", "sign", "square", "floor", "ceil", "round")},
    **{n: floating(getattr(torch, n))
       for n in ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf")},
    "clamp": lambda x, a: torch.clamp(x, a.get("min"), a.get("max")),
    # indexing
    "gather": lambda x, i, a: torch.gather(x, a["axis"], i),
    "index_select": lambda x, i, a: torch.index_select(x, a["axis"], i.reshape(-1)),
    "scatter_add": lambda s, i, src, a: torch.scatter_add(s, a["axis"], i, src),
    "one_hot": lambda i, a: F.one_hot(i, a["num_classes"]),
    "cat": lambda *xs: torch.cat(xs[:-1], xs[-1]["axis"]),
    # losses
    "nll_loss": lambda lp, labels, a: (nll(lp, labels, a),
                                       (labels != a.get("ignore_index", -100)).to(lp.dtype)),
    "nll_loss_backward": nll_backward,
    # matmul and padding
    "matmul": lambda x, y, a: torch.matmul(x, y.mT if a.get("transpose_b") and y.dim() >= 2 else y),
    "pad": lambda x, a: F.pad(x, a["pads"], value=a["value"]),
    # pooling
    "max_pool2d": lambda x, a: F.max_pool2d(x, *pool_args(a), dilation=pair(a.get("dilation"), 1),
                                            return_indices=True),
    "avg_pool2d": lambda x, a: F.avg_pool2d(x, *pool_args(a), count_include_pad=a.get("count_include_pad", True)),
    "max_pool2d_backward": lambda g, i, a: torch.ops.aten.max_pool2d_with_indices_backward(
        g, g.new_zeros(a["input_shape"]), *pool_args(a), pair(a.get("dilation"), 1), False, i),
    "avg_pool2d_backward": lambda g, a: torch.ops.aten.avg_pool2d_backward(
        g, g.new_zeros(a["input_shape"]), *pool_args(a), False, a.get("count_include_pad", True), None),
    # reductions
    "sum": lambda x, a: torch.sum(x, axes_of(x, a), keepdim=a.get("keepdim", False)),
    "mean": lambda x, a: torch.mean(flt(x), axes_of(x, a), keepdim=a.get("keepdim", False)),
    "prod": lambda x, a: reduce_each(lambda t, d, k: torch.prod(t, d, keepdim=k), x, a),
    "exclusive_prod": lambda x, a: exclusive_prod(x),
    "max": lambda x, a: torch.amax(x, axes_of(x, a), keepdim=a.get("keepdim", False)),
    "min": lambda x, a: torch.amin(x, axes_of(x, a), keepdim=a.get("keepdim", False)),
    "argmax": lambda x, a: arg_extreme(torch.argmax, x, a),
    "argmin": lambda x, a: arg_extreme(torch.argmin, x, a),
    "var": lambda x, a: torch.var(flt(x), axes_of(x, a), correction=a.get("correction", 1),
                                  keepdim=a.get("keepdim", False)),
    "std": lambda x, a: torch.std(flt(x), axes_of(x, a), correction=a.get("correction", 1),
                                  keepdim=a.get("keepdim", False)),
    "logsumexp": lambda x, a: torch.logsumexp(flt(x), axes_of(x, a) or [0], keepdim=a.get("keepdim", False)),
    "softmax": lambda x, a: torch.softmax(x, a["dim"]),
    "log_softmax": lambda x, a: torch.log_softmax(x, a["dim"]),
    # shapes and copies
    "permute": lambda x, a: x.permute(a["dims"]),
    "squeeze": lambda x, a: x.squeeze(tuple(a["axes"])) if "axes" in a else x.squeeze(),
    "unsqueeze": lambda x, a: x.unsqueeze(a["axis"]),
    "slice": slice_,
    "slice_backward": lambda g, a: torch.ops.aten.slice_backward(g, a["shape"], a["axis"], a["start"], a["stop"],
                                                                 a["step"]),
    "reshape": lambda x, a: x.reshape(a["shape"]),
    "view": lambda x, a: x.view(a["shape"]),
    "broadcast_to": lambda x, a: torch.broadcast_to(x, a["shape"]),
    "cast": lambda x, a: x.to(a["dtype"]),
    "clone": lambda x, a: x.clone(),
    "to_device": lambda x, a: x.to(a["device"]),
}

CREATION = {"full", "arange", "linspace", "eye"}


def _mean_check(out, mean, std, what):
    """The sample mean within 6 standard errors of the distribution's."""
    x = out.double().flatten()
    err = 6 * std / math.sqrt(max(x.numel(), 1))
    if abs(x.mean().item() - mean) > err:
        return f"{what}: sample mean {x.mean().item():.4f}, expected {mean:.4f} +- {err:.4f}"
    return None


def _in_range(out, lo, hi, closed=False):
    x = out.double()
    bad = (x < lo) | ((x > hi) if closed else (x >= hi)) | torch.isnan(x)
    return f"{int(bad.sum())} values outside [{lo}, {hi}{']' if closed else ')'}" if bad.any() else None


def _bernoulli_tensor(outs, inputs, a):
    p = inputs[0].double()
    y = outs[0].double()
    valid = (p >= 0) & (p <= 1)
    if ((y[valid] != 0) & (y[valid] != 1)).any():
        return "values other than 0 and 1"
    if (y[p == 0] != 0).any() or (y[p == 1] != 1).any():
        return "p = 0 gave 1 or p = 1 gave 0"
    n = int(valid.sum())
    if n == 0:
        return None
    mean, var = p[valid].mean().item(), (p[valid] * (1 - p[valid])).sum().item() / n / n
    return _mean_check(y[valid], mean, math.sqrt(var * n), "bernoulli_tensor")


# Properties of kiln's random streams, checked against the distribution (PyTorch's own
# generator draws other numbers). Each returns an error string or None.
RANDOM = {
    "rand": lambda outs, ins, a: _in_range(outs[0], 0, 1) or _mean_check(outs[0], 0.5, math.sqrt(1 / 12), "rand"),
    "randn": lambda outs, ins, a: _mean_check(outs[0], 0, 1, "randn")
    or _mean_check(outs[0].double() ** 2, 1, math.sqrt(2), "randn second moment"),
    "randint": lambda outs, ins, a: _in_range(outs[0], a["low"], a["high"])
    or _mean_check(outs[0], (a["low"] + a["high"] - 1) / 2,
                   math.sqrt(((a["high"] - a["low"]) ** 2 - 1) / 12), "randint"),
    "bernoulli": lambda outs, ins, a: _in_range(outs[0], 0, 1, closed=True)
    or (None if ((outs[0] == 0) | (outs[0] == 1)).all() else "values other than 0 and 1")
    or _mean_check(outs[0], a["p"], math.sqrt(a["p"] * (1 - a["p"])), "bernoulli"),
    "bernoulli_tensor": _bernoulli_tensor,
}


def _abs(t):
    return t.double().abs()


def _sums(fn, index=()):
    """fn over |inputs| in f64 (but the inputs at `index`): the scale of a sum's rounding error."""
    return lambda *args: fn(*[t if i in index else _abs(t) for i, t in enumerate(args[:-1])], args[-1])


def _var_magnitude(x, a):
    axes = axes_of(x, a)
    n = 1
    for d in axes:
        n *= x.shape[d] if x.dim() else 1
    sq = torch.sum(_abs(x) ** 2, axes, keepdim=a.get("keepdim", False))
    return sq / max(n - a.get("correction", 1), 1)


# Per op, the f64 magnitude of output 0's terms; compare() scales tolerances by it.
MAGNITUDE = {
    "sum": _sums(OPS["sum"]),
    "mean": _sums(OPS["mean"]),
    "matmul": _sums(OPS["matmul"]),
    "conv2d": _sums(OPS["conv2d"]),
    "conv2d_grad_input": _sums(OPS["conv2d_grad_input"]),
    "conv2d_grad_weight": _sums(OPS["conv2d_grad_weight"]),
    "avg_pool2d": _sums(OPS["avg_pool2d"]),
    "scatter_add": _sums(OPS["scatter_add"], index=(1,)),
    "var": _var_magnitude,
    "std": lambda x, a: _var_magnitude(x, a).sqrt(),
    "logsumexp": lambda x, a: torch.amax(_abs(x), axes_of(x, a) or [0], keepdim=a.get("keepdim", False)),
    "log_softmax": lambda x, a: _abs(x) + torch.amax(_abs(x), a["dim"], keepdim=True),
}


def _expand_back(t, x, a):
    """An output-shaped t broadcast back over the reduced axes of x."""
    if not a.get("keepdim", False) and x.dim():
        for d in sorted(d % x.dim() for d in axes_of(x, a)):
            t = t.unsqueeze(d)
    return t.broadcast_to(x.shape)


def _var_grad_magnitude(x, cot, out, a):
    """|g| (|x| + mean |x|) / dof: the scale of the gradient's error from the mean's rounding."""
    ax = axes_of(x, a)
    n = 1
    for d in ax:
        n *= x.shape[d] if x.dim() else 1
    dof = max(n - a.get("correction", 1), 1)
    mean_abs = torch.mean(_abs(x), ax, keepdim=True) if x.dim() else _abs(x)
    return 2 * _expand_back(_abs(cot), x, a) * (_abs(x) + mean_abs) / dof


# Per op, the f64 scale of input 0's gradient error: (x, cotangent 0, kiln's output 0, attrs).
GRAD_MAGNITUDE = {
    "var": lambda x, cot, out, a: _var_grad_magnitude(x, cot, out, a),
    "std": lambda x, cot, out, a: _var_grad_magnitude(x, cot, out, a) / (2 * _expand_back(_abs(out), x, a)),
}

"""Deliberate differences between kiln and PyTorch, each stated in the README. A rule either
replays the case in PyTorch under kiln's documented behaviour (RERUNS: the case is a known
difference when the replay agrees everywhere), or names the elements it explains (MASKS:
known when every mismatch lies there). Anything else stays a failure."""
import torch

from difftest_ops import DTYPES, axes_of, exclusive_prod, pool_args, pair


class Rerun:
    def __init__(self, reason, applies, adapt):
        self.reason, self.applies, self.adapt = reason, applies, adapt


class Mask:
    def __init__(self, reason, explains):
        self.reason, self.explains = reason, explains


def _data(case):
    """Indices of the inputs holding values (not indices, labels or a where condition)."""
    return [i for i, s in enumerate(case["inputs"]) if not s["index"]]


def _cast_inputs(which, to):
    """adapt: inputs `which(i, x)` selects cast to `to(x)`."""
    def adapt(fn, args, attrs):
        return fn, [x.to(to(x)) if which(i, x) else x for i, x in enumerate(args)]
    return adapt


def _promote(case):
    idx = _data(case)

    def adapt(fn, args, attrs):
        dt = args[idx[0]].dtype
        for i in idx[1:]:
            dt = torch.promote_types(dt, args[i].dtype)
        return fn, [x.to(dt) if i in idx else x for i, x in enumerate(args)]
    return adapt


class _ProdOthers(torch.autograd.Function):
    """prod over axes whose backward is g times the product of the other elements."""

    @staticmethod
    def forward(ctx, x, attrs):
        from difftest_ops import OPS
        ctx.save_for_backward(x)
        ctx.attrs = attrs
        return OPS["prod"](x, attrs)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        axes = sorted({d % max(x.dim(), 1) for d in axes_of(x, ctx.attrs)}) if x.dim() else []
        keep = [d for d in range(x.dim()) if d not in axes]
        moved = x.permute(keep + axes)
        rows = moved.reshape(-1, max(moved[(0,) * len(keep)].numel(), 1) if x.numel() else 1)
        others = exclusive_prod(rows.double()).reshape(moved.shape).permute(
            [(keep + axes).index(d) for d in range(x.dim())]).to(x.dtype)
        shape = [1 if d in axes else s for d, s in enumerate(x.shape)]
        return g.reshape(shape) * others, None


def _in_window(g, idx, attrs):
    """g with 0 where the saved index is outside its output's pooling window."""
    k, st, pad = pool_args(attrs)
    dil = pair(attrs.get("dilation"), 1)
    w = attrs["input_shape"][3]
    mask = torch.zeros_like(idx, dtype=torch.bool)
    for pos in torch.cartesian_prod(*[torch.arange(s) for s in idx.shape]).tolist():
        r, c = divmod(int(idx[tuple(pos)]), w)
        oy, ox = pos[2], pos[3]
        rows = [oy * st[0] - pad[0] + i * dil[0] for i in range(k[0])]
        cols = [ox * st[1] - pad[1] + j * dil[1] for j in range(k[1])]
        mask[tuple(pos)] = r in rows and c in cols
    return torch.where(mask.to(g.device), g, torch.zeros_like(g))


def _one_hot_zero_rows(fn, args, attrs):
    """PyTorch's one_hot with a zero row where the index is outside [0, num_classes)."""
    def run(index, a):
        n = a["num_classes"]
        idx = index.long()
        ok = (idx >= 0) & (idx < n)
        return torch.nn.functional.one_hot(torch.where(ok, idx, 0), n) * ok.unsqueeze(-1)
    return run, args


def _int_range(dt):
    info = torch.iinfo(DTYPES[dt])
    return info.min, info.max


RERUNS = [
    Rerun("integer pow returns f32: pow is a floating function in kiln (promote_float); PyTorch keeps the "
          "integer dtype and wraps",
          lambda c: c["op"] in ("pow", "pow_scalar", "rpow_scalar") and
          not any(s["dtype"] in ("f32", "f64", "f16", "bf16") for s in c["inputs"]),
          _cast_inputs(lambda i, x: True, lambda x: torch.float32)),
    Rerun("f16/bf16 compute in f32 and round once; PyTorch's CPU kernels round some intermediates to f16/bf16",
          lambda c: any(s["dtype"] in ("f16", "bf16") for s in c["outputs"]),
          _cast_inputs(lambda i, x: x.dtype in (torch.float16, torch.bfloat16), lambda x: torch.float32)),
    Rerun("mixed input dtypes are promoted first (matmul, conv2d, scatter_add accept them; PyTorch refuses), "
          "and their gradients computed in the promoted dtype",
          lambda c: len({c["inputs"][i]["dtype"] for i in _data(c)}) > 1, None),
    Rerun("bool operands subtract as 0 and 1 (PyTorch refuses bool subtraction)",
          lambda c: c["op"] in ("sub", "sub_scalar", "rsub_scalar") and any(s["dtype"] == "bool" for s in c["inputs"]),
          None),
    Rerun("one_hot takes i32 indices (cast to i64); PyTorch takes only int64",
          lambda c: c["op"] == "one_hot" and c["inputs"][0]["dtype"] == "i32",
          _cast_inputs(lambda i, x: True, lambda x: torch.int64)),
    Rerun("prod's gradient is the product of the other elements (prefix x suffix in f64): finite where "
          "PyTorch's prod / x overflows or meets inf / inf",
          lambda c: c["op"] == "prod",
          lambda fn, args, attrs: (lambda x, a: _ProdOthers.apply(x, a), args)),
    Rerun("an out-of-range one_hot index is no error on the GPU (checking it would need a host sync): its row "
          "stays zero; the CPU and PyTorch raise",
          lambda c: c["op"] == "one_hot", _one_hot_zero_rows),
    Rerun("max_pool2d_backward ignores an index outside its window (max_pool2d never saves one); PyTorch "
          "scatters to it",
          lambda c: c["op"] == "max_pool2d_backward",
          lambda fn, args, attrs: (lambda g, i, a: fn(_in_window(g, i, a), i, a), args)),
]


def _cast_saturates(case, inputs, tensors, m):
    if m.mask is None or case["op"] != "cast" or m.kind != "values" or not inputs[0].is_floating_point():
        return False
    target = case["outputs"][0]["dtype"]
    if target not in ("i32", "i64", "u8"):
        return False
    lo, hi = _int_range(target)
    x = inputs[0].double()
    outside = ~torch.isfinite(x) | (x.trunc() < lo) | (x.trunc() > hi)
    return bool((m.mask <= outside).all())


def _grad_at_nan(case, inputs, tensors, m):
    """A gradient mismatch only where an input's broadcast element is NaN."""
    if m.mask is None or not m.what.startswith("grad"):
        return False
    i = int(m.what[4:])
    out_shape = case["outputs"][0]["shape"]
    try:
        nan = torch.zeros(out_shape, dtype=torch.bool)
        for x in inputs:
            if x.is_floating_point():
                nan |= torch.isnan(x).broadcast_to(out_shape)
    except RuntimeError:
        return False
    shape = inputs[i].shape
    nan = nan.to(torch.int32)
    if nan.dim() > len(shape):  # reduced back to the input's shape, as sum_to does
        nan = nan.sum(list(range(nan.dim() - len(shape))))
    dims = [d for d, s in enumerate(shape) if s == 1 and nan.shape[d] != 1]
    if dims:
        nan = nan.sum(dims, keepdim=True)
    return bool((m.mask <= (nan > 0).reshape(shape)).all())


def _near_overflow(case, inputs, tensors, m):
    """Every mismatch is non-finite on one side or within 16x of the dtype's max."""
    if m.mask is None or case["values"] == "random":
        return False
    if not m.kiln.is_floating_point():
        return False
    big = torch.finfo(m.kiln.dtype).max / 16
    a, b = m.kiln.double(), m.ref.double()
    edge = ~torch.isfinite(a) | ~torch.isfinite(b) | (a.abs() >= big) | (b.abs() >= big)
    return bool((m.mask <= edge).all())


def _clamp_bound(case, inputs, tensors, m):
    """clamp's gradient mismatches only where x equals a bound."""
    if m.mask is None or case["op"] != "clamp" or not m.what.startswith("grad"):
        return False
    x = inputs[0].double()
    at = torch.zeros_like(x, dtype=torch.bool)
    for k in ("min", "max"):
        if k in case["attrs"]:
            at |= x == float(case["attrs"][k]["v"])
    return bool((m.mask <= at).all())


def _randint_wraps(case, inputs, tensors, m):
    a = {k: v["v"] for k, v in case["attrs"].items()}
    dt = a.get("dtype")
    if case["op"] != "randint" or dt not in ("i32", "u8"):
        return False
    lo, hi = _int_range(dt)
    if a["low"] >= lo and a["high"] - 1 <= hi:
        return False
    span = hi - lo + 1
    allowed = {(v - lo) % span + lo for v in range(a["low"], a["high"])}
    return set(tensors["out0"].flatten().tolist()) <= allowed


MASKS = [
    Mask("float -> integer cast saturates: NaN -> 0, out-of-range values and +-inf -> the dtype's min/max "
         "(undefined behaviour in PyTorch, which differs by device)", _cast_saturates),
    Mask("no gradient flows to a NaN through a comparison mask (relu, maximum/minimum, clamp compare NaN as "
         "false); PyTorch's masks pass it", _grad_at_nan),
    Mask("at the edge of overflow (+-inf or values within 16x of the dtype's max) kiln and PyTorch evaluate "
         "in different orders: one side overflows to +-inf or NaN where the other does not", _near_overflow),
    Mask("clamp's gradient flows at x equal to min or max (min <= x <= max); the PyTorch of this check "
         "(2.15) passes none there", _clamp_bound),
    Mask("randint over a range outside an integer dtype converts the i64 draw (wrapping); PyTorch raises",
         _randint_wraps),
]


def explain(case, inputs, tensors, mismatches, rerun):
    """The reasons explaining every mismatch of the case, or [] when one is unexplained.
    `rerun(adapt)` replays the case and returns its mismatches. Each applicable rerun is
    tried alone, then all of them together; masks explain what a replay leaves."""
    rules = [(r.reason, r.adapt or _default_adapt(r, case)) for r in RERUNS if r.applies(case)]
    for combo in [[r] for r in rules] + ([rules] if len(rules) > 1 else []):
        masked = _by_masks(case, inputs, tensors, rerun(_compose([a for _, a in combo])))
        if masked is not None:
            return sorted({reason for reason, _ in combo} | set(masked))
    return _by_masks(case, inputs, tensors, mismatches) or []


def _by_masks(case, inputs, tensors, mismatches):
    reasons = set()
    for m in mismatches:
        reason = next((k.reason for k in MASKS if _safe(k.explains, case, inputs, tensors, m)), None)
        if reason is None:
            return None
        reasons.add(reason)
    return sorted(reasons)


def _compose(adapts):
    def adapt(fn, args, attrs):
        for a in adapts:
            fn, args = a(fn, args, attrs)
        return fn, args
    return adapt


def _default_adapt(rule, case):
    return _promote(case) if "promoted" in rule.reason else _bool_to_output(case)


def _safe(explains, *args):
    try:
        return explains(*args)
    except (RuntimeError, ValueError, IndexError):  # a rule that does not fit the case explains nothing
        return False


def _bool_to_output(case):
    out = DTYPES[case["outputs"][0]["dtype"]]
    return _cast_inputs(lambda i, x: x.dtype == torch.bool, lambda x: out)

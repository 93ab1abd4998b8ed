"""diffusers integration: the attention of a diffusers model (Wan, Flux, QwenImage, LTX, Hunyuan...)
runs on fp4attn wherever fp4attn can run it, and on diffusers' own native attention elsewhere.

    import fp4attn.diffusers
    with fp4attn.diffusers.enable(pipe, recipe="fp8") as routing:   # or enable(pipe.transformer)
        video = pipe(prompt).frames
    print(routing.stats)   # fp4attn 2400 calls; native 0

How: diffusers' models call `dispatch_attention_fn`, which runs one of the functions of its
backend registry (the "native" one, torch SDPA, unless `set_attention_backend`, the
`attention_backend` context or DIFFUSERS_ATTN_BACKEND picks another). `enable` puts a router in
the registry's "native" slot while any routing is enabled, and puts the original function back
(the same object) when the last one is disabled. The router sends a call to `fp4attn.attn_func`
(the dispatcher hands BSHD tensors, fp4attn's "bshd" layout) when the call comes from an enabled
model's forward (forward hooks; enable(None): from anywhere in the process) and fp4attn computes
what was asked; otherwise the call runs the original native function unchanged, and each such
fallback is counted with its reason in `routing.stats`.

Why not a backend of its own (`model.set_attention_backend("fp4attn")`): diffusers' backend names
are a closed Enum (AttentionBackendName), and both `set_attention_backend` and `attention_backend`
refuse a name outside it; adding a member means editing the Enum's internals, which depend on
the Python version. Nor attention processors per model: they would repeat each model's
projections, norms and RoPE, and go stale with every diffusers release. Taking over the native
slot needs one dict entry of a private registry (read in `_dispatcher` only, after checking the
diffusers version), and covers every model that goes through the dispatcher.

Falls back (counted, the model's native result unchanged): an attention mask, dropout, causal
with seqlen_q != seqlen_k (SDPA aligns the diagonal top-left, fp4attn bottom-right), a head_dim
other than 64/128, different q/k/v head dims or dtypes, heads that are not a multiple of the kv
heads or differ without enable_gqa, a dtype or device fp4attn does not run (CUDA: a GPU other
than sm_90a, a build without CUDA), a head_dim that is not contiguous, context parallelism
(`_parallel_config`), return_lse, any argument a newer diffusers adds, and (CUDA, gradients on)
a recipe without a GPU backward. Refused (ValueError): enabling a model whose dispatcher attention
is set to another backend (set_attention_backend("flash"), ...), which the router would not see.
The counters are Python state updated by the router: under torch.compile, read them from an
eager run.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from . import _checks, _defaults, _layout
from ._native import UnsupportedError, engine_refusal
from .api import attn_func

if TYPE_CHECKING:
    from typing_extensions import Self

MIN_DIFFUSERS = (0, 35)  # the first release with the attention dispatcher
TESTED_DIFFUSERS = "0.35 to 0.42"
# The arguments of diffusers' native backend that the router understands; the dispatcher passes
# only the names of the native function's signature.
_KNOWN_ARGS = frozenset(
    ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
)


class _Dispatcher(NamedTuple):
    """What the router needs of diffusers' attention dispatcher."""

    functions: dict  # backend name -> the function dispatch_attention_fn calls
    native: object  # the native backend's name (AttentionBackendName.NATIVE)
    active: Callable[[], object]  # the backend a processor without its own runs


def _dispatcher() -> _Dispatcher:
    """The one place that reads diffusers' private attention registry, after checking the
    diffusers version and the registry's form."""
    try:
        import diffusers
        from diffusers.models import attention_dispatch
    except ImportError as e:
        raise ImportError("fp4attn.diffusers needs diffusers: pip install diffusers") from e
    version = diffusers.__version__
    major_minor = re.match(r"(\d+)\.(\d+)", version)
    if major_minor is None or tuple(map(int, major_minor.groups())) < MIN_DIFFUSERS:
        raise ImportError(
            f"fp4attn.diffusers needs diffusers >= {'.'.join(map(str, MIN_DIFFUSERS))} (its "
            f"attention dispatcher); this is diffusers {version}"
        )
    registry = getattr(attention_dispatch, "_AttentionBackendRegistry", None)
    native = getattr(getattr(attention_dispatch, "AttentionBackendName", None), "NATIVE", None)
    functions = getattr(registry, "_backends", None)
    arg_names = getattr(registry, "_supported_arg_names", {})
    if not (
        isinstance(functions, dict)
        and native in functions
        and {"query", "key", "value"} <= set(arg_names.get(native, ()))
        and hasattr(registry, "_active_backend")
    ):
        raise ImportError(
            f"fp4attn.diffusers: diffusers {version}'s attention dispatcher has no registry of "
            f"the form this integration knows (tested with diffusers {TESTED_DIFFUSERS}); please "
            "report it with the diffusers version"
        )
    return _Dispatcher(functions, native, lambda: registry._active_backend)


@dataclass
class AttentionStats:
    """What the attention calls of an enabled routing ran: `fp4attn` calls on fp4attn, and per
    reason (str) the calls that fell back to diffusers' native attention."""

    fp4attn: int = 0
    fallbacks: collections.Counter = field(default_factory=collections.Counter)

    @property
    def native(self) -> int:
        """Calls that fell back to diffusers' native attention."""
        return sum(self.fallbacks.values())

    def reset(self) -> None:
        self.fp4attn = 0
        self.fallbacks.clear()

    def __str__(self) -> str:
        reasons = "; ".join(f"{n} x {why}" for why, n in self.fallbacks.most_common())
        return f"fp4attn {self.fp4attn} calls; native {self.native}" + (
            f" ({reasons})" if reasons else ""
        )


class Routing:
    """An enabled fp4attn routing (returned by `enable`): `stats`, `disable()`, a context
    manager that disables it on exit."""

    def __init__(self, recipe: str | None, modules: tuple[torch.nn.Module, ...]):
        self.recipe = recipe
        self.modules = modules
        self.stats = AttentionStats()
        self.active = True
        self._hooks: list = []

    def disable(self) -> None:
        """Stops routing (the model's attention is diffusers' native again); idempotent."""
        if not self.active:
            return
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self.active = False
        _release(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.disable()

    def __repr__(self) -> str:
        scope = ", ".join(type(m).__name__ for m in self.modules) or "every model"
        state = "" if self.active else ", disabled"
        recipe = self.recipe or f"default ({_defaults.get_default_recipe()})"
        return f"<fp4attn.diffusers routing of {scope}, recipe {recipe}{state}: {self.stats}>"


# ---- the native slot's state ---------------------------------------------------------------------
_lock = threading.Lock()
_original: Callable | None = None  # diffusers' native function while the router holds its slot
_routings: list[Routing] = []  # enabled routings, in the order enabled
_in_forward = threading.local()  # .stack: model-scoped routings whose model is in forward()


def _current() -> Routing | None:
    """The routing of this call: the innermost enabled model in forward, else the latest
    process-wide routing, else None."""
    stack = getattr(_in_forward, "stack", None)
    if stack:
        return stack[-1]
    for routing in reversed(_routings):
        if not routing.modules:
            return routing
    return None


def _router(*args, **kwargs):
    """Diffusers' native backend while a routing is enabled."""
    routing = _current()
    if routing is None:
        return _original(*args, **kwargs)
    reason = "arguments: passed by position" if args else _why_native(routing.recipe, kwargs)
    if reason is not None:
        routing.stats.fallbacks[reason] += 1
        return _original(*args, **kwargs)
    routing.stats.fp4attn += 1
    return attn_func(
        kwargs["query"],
        kwargs["key"],
        kwargs["value"],
        softmax_scale=kwargs.get("scale"),
        causal=bool(kwargs.get("is_causal", False)),
        recipe=routing.recipe,
        layout="bshd",
    )


def _why_native(recipe: str | None, kwargs: dict) -> str | None:
    """Why this call must run diffusers' native attention (a reason naming the argument), or
    None when fp4attn computes exactly what was asked."""
    for name, value in kwargs.items():
        # return_lse=True, a _parallel_config, or an argument of a newer diffusers that is set
        if name not in _KNOWN_ARGS and value is not None and value is not False:
            return f"{name}: set (fp4attn.diffusers does not handle it)"
    q, k, v = kwargs["query"], kwargs["key"], kwargs["value"]
    if kwargs.get("attn_mask") is not None:
        return "attn_mask: a mask was given"
    if kwargs.get("dropout_p", 0.0):
        return f"dropout_p: {kwargs['dropout_p']} (fp4attn has no dropout)"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return "shape: query, key and value are not 4-D [batch, seqlen, heads, head_dim]"
    if q.shape[-1] != k.shape[-1] or v.shape != k.shape or q.shape[0] != k.shape[0]:
        return "shape: query, key and value differ in batch, head_dim or key/value shape"
    scale = kwargs.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        return f"scale: a {type(scale).__name__}, not a Python number"
    if q.shape[-1] not in _layout.HEAD_DIMS:
        return f"head_dim: {q.shape[-1]} (fp4attn runs {', '.join(map(str, _layout.HEAD_DIMS))})"
    heads, kv_heads = q.shape[2], k.shape[2]
    if kv_heads == 0 or heads % kv_heads or (heads != kv_heads and not kwargs.get("enable_gqa")):
        return f"heads: {heads} query heads over {kv_heads} kv heads (enable_gqa not set)"
    if kwargs.get("is_causal") and q.shape[1] != k.shape[1]:
        return "is_causal: seqlen_q != seqlen_k (SDPA aligns the diagonal top-left)"
    device = q.device
    if device.type not in ("cpu", "cuda") or k.device != device or v.device != device:
        return f"device: {device.type}"
    allowed = _checks.CUDA_DTYPES if device.type == "cuda" else _checks.CPU_DTYPES
    if q.dtype not in allowed or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype: {q.dtype} on {device.type}"
    if any(t.shape[-1] > 1 and t.stride(-1) != 1 for t in (q, k, v)):
        return "stride: head_dim is not contiguous"
    if device.type == "cuda":
        refusal = engine_refusal(device.index)
        if refusal is not None:
            return refusal
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            resolved = _defaults.resolve(recipe)
            if resolved not in _layout.GPU_BACKWARD_RECIPES:
                return f"backward: recipe {resolved!r} has no GPU backward"
    return None


def _acquire(routing: Routing) -> None:
    global _original
    with _lock:
        dispatcher = _dispatcher()
        if not _routings:
            _original = dispatcher.functions[dispatcher.native]
            dispatcher.functions[dispatcher.native] = _router
        _routings.append(routing)


def _release(routing: Routing) -> None:
    global _original
    with _lock:
        _routings.remove(routing)
        if not _routings:
            functions, native, _ = _dispatcher()
            if functions[native] is _router:  # another library may have replaced it since
                functions[native] = _original
            _original = None


# ---- what enable() routes ------------------------------------------------------------------------
def _dispatcher_processors(module: torch.nn.Module) -> list:
    """The attention processors under `module` that call diffusers' dispatcher (those
    set_attention_backend configures: they have `_attention_backend`)."""
    processors = []
    for sub in module.modules():
        processor = getattr(sub, "processor", None)
        if processor is not None and hasattr(processor, "_attention_backend"):
            processors.append(processor)
    return processors


def _modules_of(model_or_pipe: object) -> tuple[torch.nn.Module, ...]:
    if isinstance(model_or_pipe, torch.nn.Module):
        candidates = [model_or_pipe]
    elif isinstance(getattr(model_or_pipe, "components", None), dict):  # a DiffusionPipeline
        candidates = [
            m for m in model_or_pipe.components.values() if isinstance(m, torch.nn.Module)
        ]
    else:
        raise TypeError(
            "model_or_pipe: expected a torch.nn.Module (a diffusers model), a diffusers "
            f"pipeline or None, got {type(model_or_pipe).__name__}"
        )
    modules = tuple(m for m in candidates if _dispatcher_processors(m))
    if not modules:
        raise UnsupportedError(
            f"model_or_pipe: no attention of this {type(model_or_pipe).__name__} goes through "
            "diffusers' attention dispatcher (dispatch_attention_fn), so fp4attn cannot route it"
        )
    return modules


def _check_native(module: torch.nn.Module) -> None:
    """Refuses a model whose dispatcher attention would run another backend than the native one,
    which the router does not see (it would silently not run fp4attn)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    dispatcher = _dispatcher()
    active = dispatcher.active()
    other = collections.Counter()
    for processor in _dispatcher_processors(module):
        backend = AttentionBackendName(processor._attention_backend or active)
        if backend != dispatcher.native:
            other[backend.value] += 1
    if other:
        names = ", ".join(f"{n} on {backend!r}" for backend, n in other.items())
        raise ValueError(
            f"model_or_pipe: the attention processors of {type(module).__name__} run other "
            f"diffusers backends than 'native' ({names}; set_attention_backend, attention_backend "
            "or DIFFUSERS_ATTN_BACKEND); fp4attn takes over the 'native' backend: call "
            "model.set_attention_backend('native') first"
        )


def enable(model_or_pipe: object = None, recipe: str | None = None) -> Routing:
    """Runs the attention of `model_or_pipe` (a diffusers model, any nn.Module holding diffusers
    attention, or a pipeline: its models that use the dispatcher) on fp4attn with `recipe` (None:
    the process default at each call, fp4attn.set_default_recipe / use_recipe); None routes every
    native-backend attention call of the process. Returns the Routing (its `stats`; `disable()`,
    or use it as a context manager). Several routings may be enabled: a call goes to the innermost
    enabled model in forward, else to the latest process-wide routing."""
    if recipe is not None:
        _defaults.resolve(recipe)  # checked now, not at the first forward
    _dispatcher()  # the diffusers version check, before any hook is added
    modules = () if model_or_pipe is None else _modules_of(model_or_pipe)
    for module in modules:
        _check_native(module)
    routing = Routing(recipe, modules)

    def enter(module, args):
        _check_native(module)  # attention_backend(...) may have changed since enable()
        stack = getattr(_in_forward, "stack", None)
        if stack is None:
            stack = _in_forward.stack = []
        stack.append(routing)

    def leave(module, args, output):
        # Runs after a failed forward too (always_call), and after a failed enter().
        stack = getattr(_in_forward, "stack", [])
        if routing in stack:
            del stack[len(stack) - 1 - stack[::-1].index(routing)]

    _acquire(routing)
    for module in modules:
        routing._hooks.append(module.register_forward_pre_hook(enter))
        routing._hooks.append(module.register_forward_hook(leave, always_call=True))
    return routing


__all__ = ["AttentionStats", "Routing", "enable"]

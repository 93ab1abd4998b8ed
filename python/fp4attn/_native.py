"""The native extension and the few helpers every module needs to call it."""

from __future__ import annotations

import torch

try:
    from . import _C
except ImportError as e:  # a source checkout without a build
    raise ImportError(
        "fp4attn: the native extension fp4attn._C is missing; install the package with "
        "`pip install .` from the repository root (see docs/python.md)"
    ) from e


class UnsupportedError(NotImplementedError, ValueError):
    """A valid request this build or device cannot run yet (e.g. a recipe the GPU engine lacks).

    It is both a NotImplementedError (it is a limitation, not a user error) and a ValueError (the
    argument named in the message is the one to change).
    """


def cuda_stream(device: torch.device) -> int:
    """The raw handle of the current stream of `device`, which every CUDA call launches on."""
    return torch.cuda.current_stream(device).cuda_stream


def require_cuda_build(what: str) -> None:
    if not _C.has_cuda():
        raise UnsupportedError(
            f"{what}: this fp4attn build has no CUDA support (nvcc was not found when it was "
            "built); reinstall on a machine with the CUDA toolkit, or pass CPU tensors"
        )


_engine_refusals: dict[int, str | None] = {}  # CUDA device index -> engine_refusal's answer


def engine_refusal(index: int | None) -> str | None:
    """Why the forward engine cannot run on CUDA device `index` (None: the current device), as a
    "device: ..." reason, or None when it can: asked of the device once (it cannot change within
    a process). The shims use it to fall back instead of raising."""
    if not _C.has_cuda():
        return "device: this fp4attn build has no CUDA kernels"
    if not torch.cuda.is_available():
        return "device: no CUDA device is visible"
    index = torch.cuda.current_device() if index is None else index
    if index not in _engine_refusals:
        try:
            with torch.cuda.device(index):
                _C.check_forward_device()
            _engine_refusals[index] = None
        except ValueError as e:  # not an sm_90a device
            _engine_refusals[index] = f"device: {e}"
    return _engine_refusals[index]


def run_cuda(fn, *args):
    """Calls a CUDA entry point; a refused recipe becomes UnsupportedError."""
    try:
        return fn(*args)
    except NotImplementedError as e:  # Status::Unsupported from the C++ core
        if isinstance(e, UnsupportedError):
            raise
        raise UnsupportedError(str(e)) from None


def as_codes(t: torch.Tensor) -> torch.Tensor:
    """FP8 operand data travel to the extension as uint8 (float8 DLPack export is recent)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

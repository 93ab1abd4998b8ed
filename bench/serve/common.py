"""What every part of the generation-loop benchmark shares: the page size, the log line, the
short and long forms of an error, and freeing memory between systems."""

from __future__ import annotations

import gc
import traceback

import torch

PAGE = 16


def log(msg):
    print(f"[serve] {msg}", flush=True)


def first_line(e):
    text = f"{type(e).__name__}: {e}"
    return (text.splitlines() or [type(e).__name__])[0][:300]


def tail(e, lines=6):
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)).splitlines()[-lines:]


def cleanup(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

"""The process-wide default recipe: what every public function runs when its `recipe` is None.

    fp4attn.set_default_recipe("nvfp4")      # from now on
    with fp4attn.use_recipe("nvfp4-fast"):   # for a block, restored on exit
        pipe(...)

Process-wide (one module global, not per thread), so that a model patched through one of the
shims (flash_attn, scaled_dot_product_attention, sageattn, the diffusers backend) can be switched
without touching its code. "fp8" is the default: on Hopper it runs at the FP4 recipes' speed
with FlashAttention-3 FP8's accuracy (README "Which recipe"; docs/decisions.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import _checks

_default = "fp8"


def get_default_recipe() -> str:
    """The recipe a public function runs when its `recipe` argument is None."""
    return _default


def set_default_recipe(recipe: str) -> str:
    """Sets the process-wide default recipe (one of fp4attn.RECIPES); returns the previous one."""
    global _default
    previous, _default = _default, _checks.check_recipe(recipe)
    return previous


@contextlib.contextmanager
def use_recipe(recipe: str) -> Iterator[str]:
    """The default recipe is `recipe` inside the block and the previous one after it."""
    previous = set_default_recipe(recipe)
    try:
        yield recipe
    finally:
        set_default_recipe(previous)


def resolve(recipe: object) -> str:
    """`recipe` checked, or the default when it is None."""
    return _default if recipe is None else _checks.check_recipe(recipe)

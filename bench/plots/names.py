"""How the figures and tables name the systems measured, and the look of each one's line, so that
a system reads and looks the same in every figure."""

from __future__ import annotations

CUDNN = "sdpa-cudnn-bf16"
FLASH = "sdpa-flash-bf16"

PEER_NAMES = {
    CUDNN: "cuDNN BF16 (torch SDPA)",
    FLASH: "FlashAttention-2 BF16 (torch SDPA)",
    "fa3-bf16": "FlashAttention-3 BF16",
    "fa3-fp8": "FlashAttention-3 FP8",
    "sage2": "SageAttention2",
}
# Short names for table headers.
PEER_SHORT = {
    CUDNN: "cuDNN BF16",
    FLASH: "FA2 BF16",
    "fa3-bf16": "FA3-BF16",
    "fa3-fp8": "FA3-FP8",
    "sage2": "SageAttention2",
}
# Series of bench runs that are measurement aids, not something a user can run.
INTERNAL_RECIPES = ("bound-no-softmax",)

# Peers dashed, fp4attn solid; one colour per system everywhere.
STYLES = {
    CUDNN: {"color": "black", "ls": "--", "marker": "o", "mfc": "white"},
    FLASH: {"color": "0.55", "ls": "--", "marker": "v", "mfc": "white"},
    "fa3-bf16": {"color": "tab:brown", "ls": "--", "marker": "D", "mfc": "white"},
    "fa3-fp8": {"color": "tab:orange", "ls": "--", "marker": "s", "mfc": "white"},
    "sage2": {"color": "tab:green", "ls": "--", "marker": "^", "mfc": "white"},
}
RECIPE_COLORS = {
    "fp8": "tab:blue",
    "fp8-fast": "navy",
    "nvfp4": "tab:red",
    "nvfp4-fast": "tab:purple",
    "mxfp4": "tab:olive",
    "nvfp4-hx": "tab:cyan",
    "nvfp4-all": "tab:gray",
    "fp4-direct": "tab:pink",
}


def system_name(system: str, recipe: str | None = None) -> str:
    """ "FlashAttention-3 FP8", "fp4attn nvfp4-fast", ... (fp4attn's systems carry the recipe)."""
    if system.startswith("fp4attn"):
        return f"fp4attn {recipe}" if recipe else "fp4attn"
    return PEER_NAMES.get(system, system)


def short_name(system: str, recipe: str | None = None) -> str:
    if system.startswith("fp4attn"):
        return str(recipe)
    return PEER_SHORT.get(system, system)


def style(system: str, recipe: str | None = None) -> dict:
    """Keyword arguments of Axes.plot for the system's line."""
    if system.startswith("fp4attn"):
        return {
            "color": RECIPE_COLORS.get(recipe or "", "tab:blue"),
            "ls": "-",
            "marker": "o",
            "lw": 2.0,
        }
    return {"lw": 1.6, **STYLES.get(system, {"color": "0.4", "ls": ":", "marker": "x"})}

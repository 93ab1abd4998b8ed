"""Fixtures shared by the Python package's tests."""

import pytest


@pytest.fixture(scope="module")
def hopper():
    """Skips the module's tests unless the current device can run the engine (sm_90a); GPU test
    modules opt in with `pytestmark = pytest.mark.usefixtures("hopper")`."""
    import fp4attn

    if not fp4attn.cuda_available():  # a CPU-only build has no check_forward_device
        pytest.skip("no CUDA device, or fp4attn built without its CUDA kernels")
    try:
        fp4attn._C.check_forward_device()
    except ValueError as e:
        pytest.skip(str(e))

"""The package's one source of kernel facts: fp4attn._layout reads them from _C (operands.h,
recipe.h, quantize.h), and the modules import each other without cycles or private names."""

import ast
import pathlib

import torch

import fp4attn
from fp4attn import _C, _layout


def test_v_key_order_is_the_extensions():
    n = 100  # several groups and a partial one
    key_at = _layout.v_key_at(n, "cpu").tolist()
    position_of = _layout.v_position_of(n, "cpu").tolist()
    assert key_at == [_C.operand_v_key_at(p) for p in range(n)]
    assert position_of == [_C.operand_v_position_of(k) for k in range(n)]
    row = _layout.v_key_at(_C.operand_v_pitch(n), "cpu").tolist()  # a whole V^T row
    assert sorted(row) == list(range(len(row)))
    assert all(row[position_of[k]] == k for k in range(n))


def test_operand_shapes_are_the_extensions():
    for s in (0, 1, 15, 16, 127, 128, 129, 1000):
        data, scale = _layout.operand_shapes((2, s, 3, 64), "v")
        assert data == (2, 3, 64, _C.operand_v_pitch(s)) and scale == (2, 3, 64)
        data, scale = _layout.operand_shapes((2, s, 3, 64), "k")
        assert data == (2, 3, s, 64) and scale == (2, 3, _C.operand_scale_tiles(s))
    assert _layout.operand_dtype("bf16") == torch.bfloat16
    for r in fp4attn.RECIPES[1:]:
        qk = torch.int8 if r.startswith("int8") else torch.float8_e4m3fn
        assert _layout.operand_dtype(r, "q") == _layout.operand_dtype(r, "k") == qk
        assert _layout.operand_dtype(r, "v") == torch.float8_e4m3fn


def test_recipe_sets():
    assert fp4attn.RECIPES[0] == "bf16"
    assert set(_layout.GPU_BACKWARD_RECIPES) == set(fp4attn.RECIPES) - {"bf16", "int8", "int8-fast"}
    assert set(_layout.SMOOTHS_K) == {"int8", "int8-fast"}
    assert _layout.HEAD_DIMS == (64, 128)
    assert _layout.PACKED_BLOCK == {"nvfp4": 16, "mxfp4": 32}
    # The FP4 quantizer behind each operand, as the golden model's (golden_operands.cc).
    nvfp4_qk = {"nvfp4": "four-over-six", "nvfp4-fast": "four-over-six",
                "nvfp4-all": "four-over-six", "nvfp4-hx": "restricted", "fp4-direct": "nearest"}  # fmt: skip
    for r in fp4attn.RECIPES:
        if r in nvfp4_qk:
            want = ("nvfp4", nvfp4_qk[r])
        else:
            want = ("mxfp4", "round-up") if r == "mxfp4" else None
        assert _layout.fp4_rule(r, "q") == _layout.fp4_rule(r, "k") == want, r
        assert _layout.fp4_rule(r, "v") == (("nvfp4", "nearest") if r == "nvfp4-all" else None), r


def _imports(path: pathlib.Path):
    """(module, names) of every relative import in a package module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:  # from . import a, b
                for alias in node.names:
                    yield alias.name, []
            else:
                yield node.module, [alias.name for alias in node.names]


def test_modules_import_without_cycles_or_private_names():
    package = pathlib.Path(fp4attn.__file__).parent
    graph = {}
    for path in sorted(package.glob("*.py")):
        name = path.stem
        graph[name] = set()
        for module, names in _imports(path):
            graph[name].add(module)
            # _native exists to hand out _C (with a readable error when it is missing).
            private = [n for n in names if n.startswith("_") and (module, n) != ("_native", "_C")]
            assert not private, f"{name} imports private {private} from {module}"
    graph["__init__"] = set()  # the package's facade imports every module
    done, active = set(), []

    def visit(m):
        assert m not in active, f"import cycle: {' -> '.join([*active, m])}"
        if m in done or m not in graph:
            return
        active.append(m)
        for dep in graph[m]:
            visit(dep)
        active.pop()
        done.add(m)

    for m in graph:
        visit(m)

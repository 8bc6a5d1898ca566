"""On Linux the mlx-cpu wheel bundles netlib's reference BLAS, which makes every multi-token forward cost as
much as that many single-token ones, so speculation cannot pay. Loading a system OpenBLAS into the global
symbol scope before MLX itself is loaded makes MLX's BLAS calls resolve to it (the same effect as LD_PRELOAD):
`import mlx_spec` does this, for the CLI and for Python users alike, and says so when it cannot."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import sys
import warnings
from pathlib import Path

OPENBLAS_CANDIDATES = ["/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0"]
OPT_OUT = "MLX_SPEC_BLAS"  # =bundled keeps MLX's own BLAS


def bundles_reference_blas() -> bool:
    """Whether the installed MLX is the Linux CPU wheel with its bundled reference BLAS (found without importing
    MLX, so that the answer can still change which BLAS MLX will use)."""
    spec = importlib.util.find_spec("mlx")
    if sys.platform != "linux" or spec is None or not spec.submodule_search_locations:
        return False
    # every location: a folder named mlx in the working directory makes `mlx` a namespace package spanning it
    return any(any((Path(location).resolve().parent / "mlx_cpu.libs").glob("libblas*.so*"))
               for location in spec.submodule_search_locations)


def system_openblas() -> str | None:
    for path in OPENBLAS_CANDIDATES:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def openblas_loaded() -> bool:
    """Whether the system OpenBLAS is mapped (NumPy's own bundled OpenBLAS does not count: MLX never uses it)."""
    openblas = system_openblas()
    try:
        return bool(openblas) and os.path.realpath(openblas) in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def use_openblas() -> None:
    """Make MLX use the system OpenBLAS; called by `import mlx_spec` before anything imports MLX. Warns once,
    with the fix, when MLX will run on the slow reference BLAS."""
    if os.environ.get(OPT_OUT) == "bundled" or not bundles_reference_blas() or openblas_loaded():
        return
    openblas = system_openblas()
    if openblas is None:
        warnings.warn("MLX runs on its bundled reference BLAS, under which speculation cannot pay: "
                      "`apt-get install libopenblas0-pthread` enables the fast path", RuntimeWarning, stacklevel=3)
    elif "mlx.core" in sys.modules:
        warnings.warn(f"mlx was imported before mlx_spec, so MLX runs on its slow bundled reference BLAS: import "
                      f"mlx_spec first, or run with LD_PRELOAD={openblas}", RuntimeWarning, stacklevel=3)
    else:
        ctypes.CDLL(openblas, mode=ctypes.RTLD_GLOBAL)


def describe() -> str:
    """Which BLAS MLX uses in this process, for reports."""
    if not bundles_reference_blas():
        return "platform BLAS"
    if openblas_loaded():
        return "OpenBLAS"
    if openblas := system_openblas():
        return f"reference BLAS (slow: import mlx_spec before mlx, or LD_PRELOAD={openblas})"
    return "reference BLAS (slow: apt-get install libopenblas0-pthread)"

"""On Linux the mlx-cpu wheel bundles netlib's reference BLAS, which makes every multi-token forward cost as
much as that many single-token ones, so speculation cannot pay. A system OpenBLAS, preloaded, fixes that; the
CLI re-executes itself with it when one is installed and says so."""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from pathlib import Path

OPENBLAS_CANDIDATES = ["/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0"]


def bundles_reference_blas() -> bool:
    import mlx.core

    libs = Path(mlx.core.__file__).resolve().parents[1] / "mlx_cpu.libs"
    return sys.platform == "linux" and bool(glob.glob(str(libs / "libblas*.so*")))


def openblas_loaded() -> bool:
    """Whether the system OpenBLAS is mapped (NumPy's own bundled OpenBLAS does not count: MLX never uses it)."""
    openblas = system_openblas()
    try:
        return bool(openblas) and os.path.realpath(openblas) in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def system_openblas() -> str | None:
    for path in OPENBLAS_CANDIDATES:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def describe() -> str:
    if not bundles_reference_blas():
        return "platform BLAS"
    if openblas_loaded():
        return "OpenBLAS (preloaded)"
    if openblas := system_openblas():
        return f"reference BLAS (slow: preload {openblas} with LD_PRELOAD)"
    return "reference BLAS (slow: apt-get install libopenblas0-pthread)"


def reexec_with_openblas() -> None:
    """Restart this very command with OpenBLAS preloaded, when that helps and is possible."""
    if os.environ.get("MLX_SPEC_BLAS") == "keep" or not bundles_reference_blas() or openblas_loaded():
        return
    openblas = system_openblas()
    if not openblas:
        print("note: MLX runs on its bundled reference BLAS, which makes speculation slow; "
              "`apt-get install libopenblas0-pthread` enables the fast path", file=sys.stderr)
        return
    env = dict(os.environ, MLX_SPEC_BLAS="keep")
    env["LD_PRELOAD"] = ":".join(filter(None, [openblas, env.get("LD_PRELOAD")]))
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

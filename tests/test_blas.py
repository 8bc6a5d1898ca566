"""On Linux, `import mlx_spec` points MLX at the system OpenBLAS (the bundled reference BLAS makes a k-token
forward cost k single-token ones), and says how to get it when it cannot."""

import os
import subprocess
import sys

import pytest

from mlx_spec.seams import linux_blas

pytestmark = pytest.mark.skipif(not linux_blas.bundles_reference_blas(), reason="MLX here has no bundled reference BLAS")

MATMUL = """
{first}
import mlx.core as mx
from mlx_spec import linux_blas
mx.eval(mx.ones((4, 8)) @ mx.ones((8, 4)))
print(linux_blas.describe())
"""


def run(first: str, **env):
    environment = {k: v for k, v in os.environ.items() if k not in ("MLX_SPEC_BLAS", "LD_PRELOAD")}
    proc = subprocess.run([sys.executable, "-c", MATMUL.format(first=first)], capture_output=True, text=True,
                          env={**environment, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr


@pytest.mark.skipif(linux_blas.system_openblas() is None, reason="no system OpenBLAS installed")
def test_import_mlx_spec_first_uses_openblas_and_later_warns():
    fast, stderr = run("import mlx_spec")
    assert fast == "OpenBLAS" and not stderr
    slow, stderr = run("import mlx.core; import mlx_spec")
    assert slow.startswith("reference BLAS") and "import mlx_spec first" in stderr
    assert "LD_PRELOAD" in stderr and stderr.count("RuntimeWarning") == 1
    kept, stderr = run("import mlx_spec", MLX_SPEC_BLAS="bundled")  # the opt-out the test suite uses
    assert kept.startswith("reference BLAS") and not stderr

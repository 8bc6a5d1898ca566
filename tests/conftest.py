import os

# The suite checks exactness against mlx-lm's own decoding: MLX's bundled reference BLAS computes a row the same
# way whatever the number of rows, so a k-token verify matches k single-token steps bit for bit. Set before
# mlx_spec is imported (which would otherwise point MLX at the system OpenBLAS); test_blas.py checks that path.
os.environ.setdefault("MLX_SPEC_BLAS", "bundled")

import mlx_spec  # noqa: E402, F401  before anything imports mlx
import pytest  # noqa: E402
from tiny import build_suite  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Every tiny checkpoint (HF layout, real tokenizer), built once per test session."""
    return build_suite(tmp_path_factory.mktemp("tiny"))

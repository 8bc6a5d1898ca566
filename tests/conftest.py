import os

# The suite checks exactness against mlx-lm's own decoding: MLX's bundled reference BLAS computes a row the same
# way whatever the number of rows, so a k-token verify matches k single-token steps bit for bit. Set before
# mlx_spec is imported (which would otherwise point MLX at the system OpenBLAS); test_blas.py checks that path.
os.environ.setdefault("MLX_SPEC_BLAS", "bundled")
# Each test's adaptive policy starts from nothing, not from what an earlier test's engine learnt and kept on disk
# (the profiles' own tests point this at a folder of theirs).
os.environ["MLX_SPEC_POLICY_PROFILES"] = ""

import mlx_spec  # noqa: E402, F401  before anything imports mlx
import pytest  # noqa: E402
from suite import build_suite  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, pytestconfig):
    """Every tiny checkpoint (HF layout, real tokenizer), set up once per test session; says what it set up."""
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def progress(line):
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"tiny checkpoints: {line}")
    return build_suite(tmp_path_factory.mktemp("tiny"), progress)


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    """Two PNG images of different shapes (test_vision*.py): their patch grids differ in height and width."""
    from tiny_vision import write_image

    folder = tmp_path_factory.mktemp("images")
    return [str(write_image(folder / "wide.png", 64, 48, 0)), str(write_image(folder / "tall.png", 40, 72, 1))]

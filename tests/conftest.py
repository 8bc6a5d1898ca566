import pytest

from mlx_spec.tiny import build_suite


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Every tiny checkpoint (HF layout, real tokenizer), built once per test session."""
    return build_suite(tmp_path_factory.mktemp("tiny"))

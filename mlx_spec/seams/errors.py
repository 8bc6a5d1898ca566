"""The one exception type users see: a one-line message naming the problem and the fix; and the one for an
mlx-lm release that changed what mlx-spec relies on (`broken`)."""

import importlib.metadata


class SpecError(Exception):
    """Bad input or an impossible request; the CLI prints it on one line and exits non-zero."""


def tested_mlx_lm() -> str:
    """The mlx-lm range mlx-spec pins (pyproject.toml, read from the installed package's metadata)."""
    for requirement in importlib.metadata.requires("mlx-spec") or []:
        if requirement.startswith("mlx-lm"):
            bounds = requirement[len("mlx-lm"):].split(";")[0].strip().split(",")
            return ",".join(sorted(bounds, key=lambda bound: not bound.startswith(">")))  # lower bound first
    return ""


def broken(what: str) -> SpecError:
    import mlx_lm

    tested = tested_mlx_lm()
    return SpecError(f"mlx-lm {mlx_lm.__version__} changed {what}, which mlx-spec relies on; mlx-spec is tested "
                     f"with mlx-lm{tested}: pip install 'mlx-lm{tested}'")

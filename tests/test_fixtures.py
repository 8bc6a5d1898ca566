"""The shipped fixtures are what their recipe makes. Every run retrains each one for its first steps and compares
with what `python tests/suite.py` recorded of those steps when it shipped it (the shipped files themselves are
checked against their recorded digests as the suite sets up); `python -m pytest -m fixtures` retrains them in full
(most of the time goes to the tool model's 400 steps) and compares the files."""

import json

import pytest
from suite import FIRST_STEPS, MANIFEST, REBUILD, differing, packages_since, train_fixtures


def drift_message(names: list[str], how: str, built: dict) -> str:
    """Which fixtures drifted, how to rebuild them, and the packages installed in other versions since."""
    since = packages_since(built)
    return (f"{names} come out of their recipe {how} than shipped: if the recipe changed on purpose, run `{REBUILD}`"
            + (f" (installed since they were built: {since})" if since else ""))


def test_each_recipe_makes_its_first_steps_as_when_its_fixture_shipped(tmp_path):
    """The tokenizers in full, every trained fixture's data, start, loss and first FIRST_STEPS optimizer steps
    (and its count of steps) as when it shipped: a change to any of them changes these bytes."""
    manifest = json.loads(MANIFEST.read_text())
    rebuilt = train_fixtures(tmp_path, progress=lambda line: None, first_steps=True)
    drifted = differing(rebuilt, manifest["fixtures"])
    assert not drifted, drift_message(drifted, f"otherwise in their first {FIRST_STEPS} steps", manifest["built"])


@pytest.mark.fixtures
def test_retraining_the_fixtures_reproduces_the_shipped_files(tmp_path):
    manifest = json.loads(MANIFEST.read_text())
    rebuilt = train_fixtures(tmp_path, progress=lambda line: None)
    drifted = differing(rebuilt, manifest["fixtures"])
    assert not drifted, drift_message(drifted, "otherwise", manifest["built"])

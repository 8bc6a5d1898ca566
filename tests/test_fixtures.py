"""The shipped fixtures are what their recipe makes: deselected by default (it trains for minutes);
`python -m pytest -m fixtures` runs it."""

import json

import pytest
from suite import MANIFEST, REBUILD, train_fixtures


@pytest.mark.fixtures
def test_retraining_the_fixtures_reproduces_the_shipped_files(tmp_path):
    shipped = json.loads(MANIFEST.read_text())["fixtures"]
    rebuilt = train_fixtures(tmp_path, progress=lambda line: None)
    differing = [name for name in shipped if rebuilt.get(name) != shipped[name]]
    assert rebuilt.keys() == shipped.keys() and not differing, \
        f"{differing} come out otherwise than shipped: if the recipe changed on purpose, run `{REBUILD}`"

"""The mlx-lm seam: its self-check passes on the installed mlx-lm and fails loudly, naming the version, when a
behaviour mlx-spec relies on changes."""

import pytest
from mlx_lm.models import cache as mlx_lm_cache
from mlx_lm.models import qwen3_5

from mlx_spec.seams import compat, layout
from mlx_spec.seams.errors import SpecError


def test_the_installed_mlx_lm_passes():
    compat.check.cache_clear()
    compat.check()


def test_a_changed_cache_write_order_is_named(monkeypatch):
    original = qwen3_5.GatedDeltaNet.__call__

    def state_first(self, inputs, mask=None, cache=None):  # what a reordered mlx-lm release would do
        out = original(self, inputs, mask, cache)
        cache[1], cache[0] = cache[1], cache[0]
        return out
    monkeypatch.setattr(qwen3_5.GatedDeltaNet, "__call__", state_first)
    with pytest.raises(SpecError, match=r"mlx-lm \S+ changed the order of a Gated DeltaNet step's cache writes.*"
                                        r"pip install 'mlx-lm>="):
        compat.check_gdn()


def test_a_recurrent_layer_keeping_state_outside_its_cache_is_named(monkeypatch):
    """A release whose Mamba 2 layer counts its calls and steps its state by the count: what a replay over the kept
    positions gives is no longer what the layer held after them."""
    from mlx_lm.models import nemotron_h

    from mlx_spec.models import recurrence

    original = nemotron_h.NemotronHMamba2Mixer.__call__

    def counting(self, x, mask, cache=None):
        self.calls = getattr(self, "calls", 0) + 1
        out = original(self, x, mask, cache)
        cache[1] = cache[1] + self.calls
        return out
    recurrence.check_replay.cache_clear()
    recurrence.check_replay()
    monkeypatch.setattr(nemotron_h.NemotronHMamba2Mixer, "__call__", counting)
    recurrence.check_replay.cache_clear()
    try:
        with pytest.raises(SpecError, match=r"mlx-lm \S+ changed a recurrent layer's call"):
            recurrence.check_replay()
    finally:
        recurrence.check_replay.cache_clear()


def test_a_renamed_ring_index_is_named(monkeypatch):
    class Renamed(mlx_lm_cache.RotatingKVCache):  # a release that calls the write index something else
        def update_and_fetch(self, keys, values):
            self._idx = self.__dict__.pop("write_slot", 0)
            out = super().update_and_fetch(keys, values)
            self.write_slot = self.__dict__.pop("_idx")
            return out
    monkeypatch.setattr(compat, "RotatingKVCache", Renamed)
    with pytest.raises(SpecError, match="RotatingKVCache's ring buffer"):
        compat.check_rotating_cache()


def test_a_model_without_the_usual_final_norm_is_named():
    class Odd:
        model = object()
    with pytest.raises(SpecError, match="final norm"):
        layout.final_norm(Odd())

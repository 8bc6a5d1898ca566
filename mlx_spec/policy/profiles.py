"""What the adaptive draft-length policy learnt of a target and drafter on this machine (round costs per draft
length, acceptance per draft position; an n-gram drafter's estimates of its drafts), kept between runs so that a
command starts at the length that paid last time instead of measuring from scratch: one small JSON file per
target, drafter and machine in ~/.cache/mlx-spec/policy, or in $MLX_SPEC_POLICY_PROFILES (empty: keep nothing)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import mlx.core as mx


def folder() -> Path | None:
    value = os.environ.get("MLX_SPEC_POLICY_PROFILES", "~/.cache/mlx-spec/policy")
    return Path(value).expanduser() if value else None


class Profiles:
    """The profile of one engine: `identity` names its target, drafter and settings; the machine is added."""

    warned = False  # a profile that could not be written is said once per process

    def __init__(self, *identity: str):
        self.identity = json.dumps([*identity, platform.node(), platform.machine(), str(mx.default_device()),
                                    mx.__version__])
        where = folder()
        self.path = where / f"{hashlib.sha256(self.identity.encode()).hexdigest()[:24]}.json" if where else None

    def read(self) -> dict | None:
        """The profile kept for this identity (None: none, or one that is unreadable or another's)."""
        try:
            saved = json.loads(self.path.read_text()) if self.path else None
        except (OSError, ValueError):
            return None
        return saved["profile"] if isinstance(saved, dict) and saved.get("identity") == self.identity else None

    def write(self, profile: dict) -> None:
        if self.path is None:
            return
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"identity": self.identity, "profile": profile}))
            os.replace(partial, self.path)
        except OSError as error:
            if not Profiles.warned:
                Profiles.warned = True
                print(f"mlx-spec: cannot keep the draft-length profile in {self.path.parent} ({error.strerror}): each "
                      "run measures afresh; set MLX_SPEC_POLICY_PROFILES to a writable folder, or empty to keep none",
                      file=sys.stderr)

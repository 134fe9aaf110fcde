"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.kernel_profiles import profile_store


@pytest.fixture(scope="session")
def profiles_on_local(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], tuple[Path, dict[str, Path]]]:
    """runtime -> (store, model files) of the kernel predictor's profiling suite, run once per runtime and
    session (its readers never write to the store)."""
    made: dict[str, tuple[Path, dict[str, Path]]] = {}

    def get(runtime: str) -> tuple[Path, dict[str, Path]]:
        if runtime not in made:
            made[runtime] = profile_store(runtime, tmp_path_factory.mktemp(f"profiles-{runtime}"))
        return made[runtime]

    return get

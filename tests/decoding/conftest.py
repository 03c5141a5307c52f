"""The decoder tests need torch and transformers; without them the directory is skipped."""

from torch_skip import torch_or_skip

torch_or_skip(globals(), "tests/decoding")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test its own cache folder: what generate keeps there (step costs, arm outcomes)
    neither leaks between tests nor into the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))

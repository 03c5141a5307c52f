"""The decoder tests need torch and transformers; without them the directory is skipped."""

from torch_skip import torch_or_skip

torch_or_skip(globals(), "tests/decoding")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test its own cache folder: what generate keeps there (step costs, arm outcomes)
    neither leaks between tests nor into the user's ~/.cache. SmolLM2's HF folder, made once
    from its GGUF (most of a minute of CPU), is the user's, linked in when it exists."""
    from latticekit.decoding.costs import default_cache_dir

    smollm2 = default_cache_dir() / "smollm2-135m-instruct-hf"
    own = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(own))
    if (smollm2 / "model.safetensors").is_file():
        (own / "latticekit").mkdir()
        (own / "latticekit" / smollm2.name).symlink_to(smollm2, target_is_directory=True)

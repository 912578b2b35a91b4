"""The served models' parameters: one settings object each (rose_backend.triton.model_settings) whose
defaults are the ones config.pbtxt and docs/OPERATIONS.md's tables state, and whose bad values are
refused with an error naming the model and the parameter."""
import dataclasses
import re
from pathlib import Path

import pytest

from rose_backend.triton.model_settings import RoseSettings
from rose_ensemble.tokenize_settings import TokenizeSettings

REPO = Path(__file__).resolve().parents[2] / "model_repository"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
PARAM = re.compile(r'parameters \{ key: "([^"]+)" value: \{ string_value: "((?:[^"\\]|\\.)*)" \} \}')


def _shown(value) -> str:
    return '""' if value == "" else str(value)


def _documented_defaults() -> dict[str, list[str]]:
    """{parameter: [the default each table row of docs/OPERATIONS.md states]}: a row names its
    parameters in one cell (`name`, or `a`, `b`, `c`) and their defaults in the next."""
    rows: dict[str, list[str]] = {}
    for line in OPERATIONS.read_text().splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        for i, cell in enumerate(cells[:-1]):
            names = re.fullmatch(r"`(\w+)`(?:, `(\w+)`)*", cell) and re.findall(r"`(\w+)`", cell)
            if names:
                values = cells[i + 1].split(", ") if len(names) > 1 else [cells[i + 1]]
                for name, value in zip(names, values):
                    rows.setdefault(name, []).append(value.replace("`", ""))
    return rows


@pytest.mark.parametrize("cls,model", [(RoseSettings, "rose"), (TokenizeSettings, "tokenize")])
def test_config_pbtxt_and_the_docs_state_the_code_defaults(cls, model):
    pbtxt = dict(PARAM.findall((REPO / model / "config.pbtxt").read_text()))
    assert pbtxt, "no parameters found in config.pbtxt"
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for key, value in pbtxt.items():
        assert key in defaults, f"{model}/config.pbtxt sets {key!r}, which {cls.__name__} does not know"
        value = value.replace('\\"', '"')             # pbtxt escapes quotes
        assert value == str(defaults[key]), (key, value, defaults[key])
        pbtxt[key] = value
    assert cls.from_values(pbtxt) is not None          # the shipped file parses
    documented = _documented_defaults()
    for name, default in defaults.items():
        assert name in documented, f"docs/OPERATIONS.md has no table row for {model}'s {name!r}"
        for stated in documented[name]:
            assert stated == _shown(default) or stated.startswith(_shown(default) + " "), (name, default, stated)


def test_the_service_defaults_are_the_rose_parameters_defaults():
    """The serving core knows nothing of config.pbtxt: its defaults live in ServiceSettings (and
    batch_limits), and the `rose` parameters of the same names take them from there."""
    from rose_backend.engine.batch_limits import BATCH_SEQS, BATCH_TOKENS
    from rose_backend.serving.service_settings import ServiceSettings
    service, rose = ServiceSettings(), RoseSettings()
    shared = [f.name for f in dataclasses.fields(ServiceSettings) if hasattr(rose, f.name)]
    assert len(shared) == 12
    for name in shared:
        assert getattr(rose, name) == getattr(service, name), name
    assert rose.inline_backlog_us == service.backlog_us
    assert (rose.max_batch_tokens, rose.max_batch_seqs) == (BATCH_TOKENS, BATCH_SEQS)
    assert ServiceSettings.of(RoseSettings(max_inflight=3), inline=False) == dataclasses.replace(
        service, max_inflight=3, inline=False)


def test_parses_types_and_keeps_defaults_for_empty_values():
    s = RoseSettings.from_model_config({"name": "rose", "parameters": {
        "max_batch_tokens": {"string_value": "512"}, "device": {"string_value": ""},
        "precapture": {"string_value": "1:128, 8:4096"}, "dtype": {"string_value": "bf16"}}})
    assert (s.max_batch_tokens, s.device, s.precapture_configs, s.torch_dtype_name) == (
        512, "auto", [(1, 128), (8, 4096)], "bfloat16")
    t = TokenizeSettings.from_values({"prompts": '{"query": "query: "}', "max_request_texts": "7"})
    assert t.prompt_map == {"query": "query: "} and t.max_request_texts == 7


@pytest.mark.parametrize("cls,values,message", [
    (RoseSettings, {"max_batch_tokenz": "1"}, r"model 'rose': unknown parameter\(s\) 'max_batch_tokenz'"),
    (RoseSettings, {"max_batch_tokens": "lots"}, r"'max_batch_tokens' must be an integer, got 'lots'"),
    (RoseSettings, {"max_batch_seqs": "0"}, r"'max_batch_seqs' must be >= 1, got 0"),
    (RoseSettings, {"device": "gpu"}, r"'device' must be auto, cpu or cuda, got 'gpu'"),
    (RoseSettings, {"dtype": "int8"}, r"'dtype' must be one of"),
    (RoseSettings, {"precapture": "1x128"}, r"'precapture' takes seqs:tokens pairs"),
    (TokenizeSettings, {"prompts": '["query"]'}, r"'prompts' must be a JSON object"),
    (TokenizeSettings, {"fallback_prompts": '{"query": 1}'}, r"'fallback_prompts' must be a JSON object"),
    (RoseSettings, {"dtype": "fp8", "fp8_min_tokens": "-1"}, r"'fp8_min_tokens' must be >= 0, got -1"),
    (TokenizeSettings, {"max_request_texts": "0"}, r"model 'tokenize': parameter 'max_request_texts' must be >= 1"),
])
def test_bad_values_are_refused_naming_the_parameter(cls, values, message):
    with pytest.raises(ValueError, match=message):
        cls.from_values(values)


def test_config_pbtxt_is_edited_as_triton_reads_it(tmp_path):
    """edit_model_config (every repository copy's writer): parameters replaced or added and read back
    by the settings, a value with quotes and backslashes exactly as given, the model renamed and an
    ensemble's steps pointed at other models."""
    import shutil

    from rose_backend.launch.deployment import DEFAULT_REPOSITORY
    from rose_backend.triton.model_settings import edit_model_config, model_config_file, read_model_config
    rose = tmp_path / "rose.pbtxt"
    shutil.copy(DEFAULT_REPOSITORY / "rose" / "config.pbtxt", rose)
    edit_model_config(rose, name="rose_copy", parameters={"max_batch_tokens": "512", "dtype": "fp8"})
    cfg = model_config_file(rose)
    assert cfg["name"] == "rose_copy"
    s = RoseSettings.from_model_config(cfg)
    assert (s.max_batch_tokens, s.dtype) == (512, "fp8")
    tokenize = tmp_path / "tokenize.pbtxt"
    shutil.copy(DEFAULT_REPOSITORY / "tokenize" / "config.pbtxt", tokenize)
    prompts = '{"query": "say \\"hi\\": ", "doc": "C:\\\\x"}'
    edit_model_config(tokenize, parameters={"prompts": prompts})
    assert TokenizeSettings.from_model_config(model_config_file(tokenize)).prompt_map == {
        "query": 'say "hi": ', "doc": "C:\\x"}
    embed = tmp_path / "embed.pbtxt"
    shutil.copy(DEFAULT_REPOSITORY / "embed" / "config.pbtxt", embed)
    before = [s.model_name for s in read_model_config(embed).ensemble_scheduling.step]
    edit_model_config(embed, step_models={"rose": "rerank_rose"})
    after = [s.model_name for s in read_model_config(embed).ensemble_scheduling.step]
    assert after == ["rerank_rose" if m == "rose" else m for m in before] and "rose" in before

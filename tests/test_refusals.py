"""Issue 23's sweep of bad inputs, as tables: each row a bad input and the one clear refusal it must get (a
`PosEncError` naming the value, or for the command lines one `error: ...` line and exit code 2), and the
promises around them (no transformers warning on our own rope types, the docs saying what the code takes)."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest

import hf_posenc as hp
from hf_posenc import serving
from hf_posenc.registry import get_method
from tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]


# -- public functions with bad arguments --------------------------------------------------------------------

def _yarn():
    return hp.patch(tiny_model(), "yarn", factor=4)


API_CASES = [
    ("overrides-legacy-str", lambda: serving.serving_overrides(_yarn(), legacy="no"), hp.ParameterTypeError,
     r"legacy must be a bool, got 'no'"),
    ("overrides-legacy-int", lambda: serving.serving_overrides(_yarn(), legacy=1), hp.ParameterTypeError,
     r"legacy must be a bool, got 1"),
    ("longrope-huge-long-factor", lambda: hp.patch(tiny_model(), "longrope", factor=2, long_factor=[1e300] * 8),
     hp.InvalidParameterError, r"long_factor\[0\] must be <= 2147483647, got 1e\+300"),
    ("longrope-huge-short-factor", lambda: hp.patch(tiny_model(), "longrope", factor=2, long_factor=[2.0] * 8,
                                                    short_factor=[1.0] * 7 + [float(2**40)]),
     hp.InvalidParameterError, r"short_factor\[7\] must be <= 2147483647"),
    ("longrope-factor-past-the-context", lambda: hp.patch(tiny_model(), "longrope", factor=2,
                                                          long_factor=[1.0] * 7 + [1e8]),
     hp.InvalidParameterError, r"long_factor\[7\]=100000000.0 stretches that pair to 6.4e\+09 positions .* "
                               r"each factor <= 3.35544e\+07"),
    ("dynamic-yarn-attention-factor", lambda: hp.patch(tiny_model(), "dynamic_yarn", factor=2, attention_factor=1.2),
     hp.InvalidParameterError, r"unknown parameter\(s\) \['attention_factor'\] for method 'dynamic_yarn'"),
]


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_public_functions_refuse_bad_arguments(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_legacy_flag_still_picks_the_format():
    assert "rope_scaling" in serving.serving_overrides(_yarn(), legacy=True)
    assert "rope_parameters" in serving.serving_overrides(_yarn(), legacy=False)


# -- transformers' "Missing validation function" on hf_posenc's own rope types -------------------------------

class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("method,params", [("dynamic_yarn", {"factor": 4}), ("dynamic", {"factor": 4}),
                                           ("alibi", {})])
def test_our_rope_types_load_and_save_without_transformers_warnings(tmp_path, method, params):
    logger = logging.getLogger("transformers.modeling_rope_utils")
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.WARNING)
    try:
        model = hp.patch(tiny_model(), method, **params)
        model.save_pretrained(tmp_path)
        loaded = hp.from_pretrained(tmp_path)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert hp.describe(loaded)["method"] == method
    assert not [m for m in records.messages if "Missing validation function" in m], records.messages


def test_a_tampered_custom_rope_type_is_refused_by_the_validator():
    config = hp.patch(tiny_model(), "dynamic_yarn", factor=4).config
    params = dict(config.rope_parameters, factor="four")
    with pytest.raises(ValueError, match="factor must be a number >= 1, got 'four'"):
        config._validate_hf_posenc_dynamic_yarn_rope_parameters(params)


def test_docs_list_exactly_the_parameters_dynamic_yarn_takes():
    """docs/rope_methods.md's row names the method's own parameters (those beyond what every RoPE method takes)."""
    row = next(line for line in (ROOT / "docs" / "rope_methods.md").read_text().splitlines()
               if line.startswith("| `dynamic_yarn` |"))
    listed = set(re.findall(r"`(\w+)`", row.split(" | ")[3]))
    shared = {f.name for f in dataclasses.fields(get_method("ntk"))}
    own = {f.name for f in dataclasses.fields(get_method("dynamic_yarn"))} - shared
    assert own <= listed and "attention_factor" in listed  # named, as refused
    assert "attention_factor" not in own

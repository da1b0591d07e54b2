"""The model repository: Triton layout, config.pbtxt parsing, and the config JSON."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from xdevice._errors import ConfigurationError, InferenceError
from xdevice.serving.repository import (
    FROM_V2, V2_DATATYPES, ModelConfig, ModelNotFound, Repository, parse_pbtxt, read_config, triton_config,
)

SAMPLE = """\
name: "resnet"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1000 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 1 ] }, { count: 1 kind: KIND_CPU } ]
"""


def make_repo(root, layout: dict[str, list[str]], configs: dict[str, str] | None = None) -> Repository:
    """``layout`` maps a model to its version folders; a folder ending in '-' gets no model.onnx."""
    for model, folders in layout.items():
        (root / model).mkdir(parents=True)
        for folder in folders:
            (root / model / folder.rstrip("-")).mkdir()
            if not folder.endswith("-"):
                (root / model / folder / "model.onnx").write_bytes(b"onnx")
    for model, text in (configs or {}).items():
        (root / model / "config.pbtxt").write_text(text)
    return Repository(root)


def test_versions_are_numeric_folders_holding_model_onnx_and_the_newest_is_served(tmp_path):
    repo = make_repo(tmp_path, {"resnet": ["1", "2", "10", "11-", "latest", "old"], "bert": ["3"]})
    assert repo.models() == ["bert", "resnet"]
    assert repo.versions("resnet") == [1, 2, 10]
    assert repo.latest("resnet") == 10
    assert repo.path("resnet") == tmp_path / "resnet" / "10" / "model.onnx"
    assert repo.path("resnet", "2") == tmp_path / "resnet" / "2" / "model.onnx"


def test_version_policy_specific_limits_what_is_served(tmp_path):
    policy = 'version_policy { specific { versions: [1, 2] } }'
    repo = make_repo(tmp_path, {"m": ["1", "2", "3"]}, {"m": policy})
    assert repo.latest("m") == 2
    with pytest.raises(ModelNotFound, match="Valid choices: 1, 2"):
        repo.path("m", 3)


def test_index_lists_every_model_and_version_folder(tmp_path):
    repo = make_repo(tmp_path, {"a": ["1", "2-"], "empty": []})
    assert repo.index() == [
        {"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": ""},
        {"name": "a", "version": "2", "state": "UNAVAILABLE",
         "reason": f"no model.onnx in {tmp_path / 'a' / '2'}"},
        {"name": "empty", "version": "", "state": "UNAVAILABLE", "reason": "no numeric version folder"},
    ]


def test_unknown_model_lists_valid_names_and_the_nearest(tmp_path):
    repo = make_repo(tmp_path, {"resnet": ["1"], "bert": ["1"]})
    with pytest.raises(ModelNotFound) as info:
        repo.path("resnt")
    assert isinstance(info.value, InferenceError) and isinstance(info.value, LookupError)
    assert "Valid choices: bert, resnet" in str(info.value) and "Did you mean 'resnet'?" in str(info.value)


def test_unknown_version_lists_the_versions(tmp_path):
    repo = make_repo(tmp_path, {"m": ["1", "2"]})
    with pytest.raises(ModelNotFound, match=r"Received: '7'. Valid choices: 1, 2"):
        repo.path("m", 7)


def test_missing_root_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigurationError, match="Model repository not found"):
        Repository(tmp_path / "nope")


def test_pbtxt_sample_parses_to_nested_dicts():
    parsed = parse_pbtxt(SAMPLE)
    assert parsed["max_batch_size"] == 8 and parsed["platform"] == "onnxruntime_onnx"
    assert parsed["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}]
    assert parsed["dynamic_batching"] == {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100}
    assert parsed["instance_group"] == [{"count": 2, "kind": "KIND_GPU", "gpus": [1]},
                                        {"count": 1, "kind": "KIND_CPU"}]


def test_pbtxt_repeated_fields_and_comments_read_like_lists():
    text = """
    # written by text_format.MessageToString
    input {
      name: "x"   # the image
      dims: 3
      dims: 224
      dims: 224
    }
    input { name: 'y\\'s' dims: -1 }
    enabled: true
    """
    parsed = parse_pbtxt(text)
    assert parsed["input"] == [{"name": "x", "dims": [3, 224, 224]}, {"name": "y's", "dims": -1}]
    assert parsed["enabled"] is True


def test_sample_config_reads_into_model_config(tmp_path):
    make_repo(tmp_path, {"resnet": ["1"]}, {"resnet": SAMPLE})
    assert read_config(tmp_path / "resnet") == ModelConfig(
        name="resnet", max_batch_size=8, max_queue_delay_us=100, preferred_batch_size=(4, 8),
        dynamic_batching=True, instance_count=2, device="gpu:1")


def test_no_config_gives_triton_defaults_named_after_the_folder(tmp_path):
    repo = make_repo(tmp_path, {"plain": ["1"]})
    assert repo.config("plain") == ModelConfig(name="plain")


def test_config_json_is_accepted(tmp_path):
    make_repo(tmp_path, {"m": ["1"]})
    (tmp_path / "m" / "config.json").write_text(
        '{"max_batch_size": 4, "instance_group": [{"kind": "KIND_CPU"}]}')
    assert read_config(tmp_path / "m") == ModelConfig(name="m", max_batch_size=4)


@pytest.mark.parametrize(("text", "found"), [
    ("max_batch_size: 8\ninput [ { name: \"x\" \n", r"line 2: a field name is missing.*end of file"),
    ("name: \"m\"\nmax_batch_size 8\n", r"line 2: field 'max_batch_size' has no value"),
    ("dims: [1, 2\nname: \"m\"", r"line 2: the list of 'dims' is not closed"),
    ("name: \"m\"\n\nmax_batch_size: \"eight\"", r"line 3: wrong value for 'max_batch_size'"),
    ("max_batch_sise: 8", r"line 1: unknown field max_batch_sise.*Did you mean 'max_batch_size'"),
    ("max_batch_size: 4\ndynamic_batching {\n  max_queue_delay: 5 }",
     r"line 3: unknown field dynamic_batching.max_queue_delay"),
    ("instance_group [ { kind: KIND_TPU } ]", r"unsupported instance_group kind"),
    ("dynamic_batching { }", r"dynamic_batching needs max_batch_size > 0"),
    ("sequence_batching { }", r"'sequence_batching' \(stateful sequence models\) is not supported"),
    ("name: \"other\"", r"must match its folder name"),
])
def test_bad_config_names_the_file_and_the_problem(tmp_path, text, found):
    make_repo(tmp_path, {"m": ["1"]}, {"m": text})
    with pytest.raises(ConfigurationError, match=found) as info:
        read_config(tmp_path / "m")
    assert str(tmp_path / "m" / "config.pbtxt") in str(info.value)


def tensor(name, dtype, shape):
    return SimpleNamespace(name=name, dtype=dtype, shape=shape)


def test_triton_config_drops_the_batch_dim_and_writes_ints():
    config = ModelConfig("resnet", max_batch_size=8, max_queue_delay_us=100, preferred_batch_size=(4, 8),
                         dynamic_batching=True, instance_count=2, device="gpu:1")
    out = triton_config(config, [tensor("x", "float32", (None, 3, None, "W"))],
                        [tensor("y", "string", (None, 10))])
    assert out["input"][0]["dims"] == [3, -1, -1] and out["input"][0]["data_type"] == "TYPE_FP32"
    assert out["output"][0]["dims"] == [10] and out["output"][0]["data_type"] == "TYPE_STRING"
    assert out["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert out["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert out["instance_group"] == [{"name": "resnet", "kind": "KIND_GPU", "count": 2, "gpus": [1]}]
    assert (out["platform"], out["backend"], out["max_batch_size"]) == ("onnxruntime_onnx", "onnxruntime", 8)


def test_triton_config_without_batching_keeps_full_shapes_and_has_no_dynamic_batching():
    out = triton_config(ModelConfig("m"), [tensor("x", "bfloat16", (2, None))], [tensor("y", "bool", ())])
    assert out["input"][0]["dims"] == [2, -1] and out["input"][0]["data_type"] == "TYPE_BF16"
    assert out["output"][0]["dims"] == [] and "dynamic_batching" not in out
    assert out["instance_group"][0]["kind"] == "KIND_CPU" and out["instance_group"][0]["gpus"] == []


def test_triton_config_rejects_an_unknown_dtype():
    with pytest.raises(ConfigurationError, match="Did you mean 'float32'"):
        triton_config(ModelConfig("m"), [tensor("x", "flot32", (1,))], [])


def test_v2_datatypes_round_trip():
    assert V2_DATATYPES["float32"] == "FP32" and V2_DATATYPES["string"] == "BYTES"
    assert all(FROM_V2[v2] == name for name, v2 in V2_DATATYPES.items())

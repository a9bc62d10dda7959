"""Shared fixtures: a small real corpus (a slice of the standard library), a tiny recipe,
and a shared prepared-data cache so that expensive preparation happens once per session."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from runhelpers import process_state_restored, tiny_recipe_dict

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-references",
        action="store_true",
        help="tests/test_recipes.py writes each shipped recipe's CI reference "
        "(src/trainguard/recipes/<name>.ci.ref.json) instead of comparing with it",
    )


@pytest.fixture
def torch_globals():
    """run_recipe sets process-wide torch state (threads, determinism, seeds): restore it."""
    with process_state_restored():
        yield


# A fixed slice of real Python source: deterministic, small enough for a quick tokenizer.
CORPUS_MODULES = ("json", "email", "html", "http", "urllib", "logging", "xml/dom")


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every pytest-xdist worker of this test run shares (the parent of the workers'
    own base temp folders; the base temp folder itself without xdist). It is new for each
    test run, so nothing is shared between runs or with other users of /tmp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(root: Path, name: str, build) -> Path:
    """`root/name`, built by `build(folder)` in whichever worker gets here first (the others
    wait on a lock, then reuse it): session fixtures cost once per run, not once per worker.
    A failed build leaves nothing behind, so the next worker tries again and fails the same."""
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a failed attempt's leftovers
            folder.mkdir()
            try:
                build(folder)  # in place: what it writes may record its own paths
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder


def _copy_corpus(out: Path) -> None:
    for module in CORPUS_MODULES:
        for path in sorted((STDLIB / module).glob("*.py")):
            rel = path.relative_to(STDLIB)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / rel)


@pytest.fixture(scope="session")
def small_corpus(shared_root: Path) -> Path:
    return build_once(shared_root, "corpus", _copy_corpus)


@pytest.fixture(scope="session")
def cache_dir(shared_root: Path) -> Path:
    """The prepared-data cache of the whole run: `prepare_data` locks a key while it builds
    it, so workers preparing the same data at once build it once."""
    out = shared_root / "cache"
    out.mkdir(exist_ok=True)
    return out


@pytest.fixture
def tiny_recipe(tmp_path: Path, small_corpus: Path, cache_dir: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe_dict(small_corpus, cache_dir)))
    return path


@pytest.fixture(scope="session")
def finished_tiny_run(shared_root: Path, small_corpus: Path, cache_dir: Path):
    """A completed 12-step tiny run (checkpoints at 4, 8, 12): copy it, never modify it."""
    from runhelpers import run_cli

    def build(base: Path) -> None:
        recipe = base / "tiny.yaml"
        recipe.write_text(yaml.safe_dump(tiny_recipe_dict(small_corpus, cache_dir)))
        res = run_cli("run", str(recipe), "--run-dir", str(base / "run"), "-q")
        assert res.returncode == 0, res.stderr

    return build_once(shared_root, "finished", build) / "run"


@pytest.fixture
def tiny_run_copy(finished_tiny_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished_tiny_run, dst)
    return dst


@pytest.fixture(scope="session")
def spark():
    """One PySpark session in local mode for every Spark test of this process (the JVM starts
    once): dedup, filter and prepare all run on it."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Tests hand Spark a few rows each: a JVM that compiles only with C1 and collects with one
    # GC thread does them with about half the CPU (22 -> 12-13 s for the Spark tests here).
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS",
        "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell",
    )
    session = (
        SparkSession.builder.master("local[2]")
        .appName("trainguard-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.default.parallelism", "2")
        # Small splits so the Parquet input spans several partitions: order must survive them.
        .config("spark.sql.files.maxPartitionBytes", "65536")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()

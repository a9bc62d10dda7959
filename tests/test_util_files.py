"""The helpers every command uses for user paths: outputs never overwrite inputs, writes are
atomic and fail with the path (exit 1), and reads say exactly what is wrong (exit 2)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainguard.errors import BadInputError, DataError, OutputWriteError, exit_status_for
from trainguard.util.atomic import atomic_paths, atomic_write_text, check_writable
from trainguard.util.inputs import open_parquet, read_text, require_file
from trainguard.util.paths import credentials_error, refuse_overwrite


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "data"
    src.mkdir()
    doc = src / "a.jsonl"
    doc.write_text('{"text": "x"}\n')
    (tmp_path / "link.jsonl").symlink_to(doc)
    os.link(doc, tmp_path / "hard.jsonl")
    return {"folder": src, "doc": doc, "root": tmp_path}


@pytest.mark.parametrize(
    ("output", "words"),
    [
        ("data/a.jsonl", "is the input"),
        ("data/../data/./a.jsonl", "is the input"),
        ("link.jsonl", "is the input"),  # a symlink to the input
        ("hard.jsonl", "is the input"),  # a hard link: same inode, other name
        ("data/out.jsonl", "inside the input folder"),
        ("data/sub/deeper/out.jsonl", "inside the input folder"),  # not created yet
        ("data", "is the input"),
    ],
)
def test_an_output_that_is_or_is_inside_an_input_is_refused(files, output, words) -> None:
    out = files["root"] / output
    with pytest.raises(BadInputError, match=words) as e:
        refuse_overwrite({"--out": out}, {"SOURCE": files["doc"], "FOLDER": files["folder"]})
    assert "--out" in e.value.message and "--out" in e.value.fix
    assert exit_status_for(e.value) == 2


def test_outputs_elsewhere_urls_and_stdlib_pass(files) -> None:
    refuse_overwrite(
        {"--out": files["root"] / "out.jsonl", "--clusters": "s3://b/c.jsonl", "--x": None},
        {"SOURCE": files["folder"], "IN": "stdlib", "URL": "s3://b/c.jsonl"},
    )
    # a folder that contains the input is fine unless the command replaces it as a whole
    refuse_overwrite({"--out": files["root"]}, {"SOURCE": files["doc"]})
    with pytest.raises(BadInputError, match="folder the command replaces"):
        refuse_overwrite({"--out": files["root"]}, {"IN": files["doc"]}, replaced_folders=["--out"])


def test_two_outputs_on_one_file_are_refused(files) -> None:
    out = files["root"] / "o.jsonl"
    with pytest.raises(BadInputError, match="--out and --clusters are the same file"):
        refuse_overwrite({"--out": out, "--clusters": files["root"] / "x/../o.jsonl"}, {})


def test_atomic_paths_commit_together_or_not_at_all(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "sub" / "b.png"
    a.write_text("old")
    a.chmod(0o640)
    with atomic_paths(a, b) as (ta, tb):
        # In a private folder beside the target, under the target's own name.
        assert ta.parent.parent == a.parent and ta.parent.name.startswith(".a.txt.tmp-")
        assert ta.name == "a.txt" and tb.suffix == ".png"
        ta.write_text("new a")
        tb.write_text("new b")
        assert a.read_text() == "old" and not b.exists()  # nothing visible before the end
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert stat.S_IMODE(a.stat().st_mode) == 0o640  # an existing file keeps its mode
    assert stat.S_IMODE(b.stat().st_mode) & 0o444  # a new one is readable, not mkstemp's 0600
    with pytest.raises(RuntimeError), atomic_paths(a, b) as (ta, tb):
        ta.write_text("half")
        raise RuntimeError("the writer failed")
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.txt", "b.png", "sub"]
    with pytest.raises(RuntimeError), atomic_paths(tmp_path / "new" / "deeper" / "c.txt"):
        raise RuntimeError("failed before anything was written")
    assert not (tmp_path / "new").exists()  # the folders it made are gone again


def test_a_write_failure_names_the_path_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(OutputWriteError, match="dir.json: Is a directory") as e:
        atomic_write_text(tmp_path / "dir.json", "{}")
    assert exit_status_for(e.value) == 1 and "folder is in the way" in e.value.fix
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(OutputWriteError, match="afile/out.json") as e:
        atomic_write_text(blocker / "out.json", "{}")
    assert "file is in the way" in e.value.fix
    # an OSError from the writer itself (here: a full disk) names the target, not the temp
    with (
        pytest.raises(OutputWriteError, match=r"out\.json: No space left") as e,
        atomic_paths(tmp_path / "out.json") as (tmp,),
    ):
        raise OSError(28, "No space left on device", str(tmp))
    assert "free disk space" in e.value.fix
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "dir.json"]


def test_check_writable_fails_early_and_creates_nothing(tmp_path: Path) -> None:
    check_writable(tmp_path / "new" / "deeper" / "out.json")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OutputWriteError, match="Is a directory"):
        check_writable(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputWriteError, match="Not a directory"):
        check_writable(tmp_path / "f" / "out.json")
    # a folder output (scale run --out): an existing folder is fine, a file in its place is not
    check_writable(tmp_path, folder=True)
    check_writable(tmp_path / "new-folder", folder=True)
    with pytest.raises(OutputWriteError, match="f: Not a directory"):
        check_writable(tmp_path / "f", folder=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_read_text_says_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "r.yaml"
    bad.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(
        DataError, match=r"r.yaml is not valid UTF-8 \(byte 0xe9 at offset 24, line 2"
    ):
        read_text(bad, "recipe", error=DataError)
    with pytest.raises(BadInputError, match="is a folder, not a file"):
        read_text(tmp_path, "recipe")
    with pytest.raises(BadInputError, match="does not exist"):
        read_text(tmp_path / "missing.yaml", "recipe")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(BadInputError, match="broken symbolic link"):
        require_file(tmp_path / "dangling", "recipe", "fix")
    with pytest.raises(BadInputError, match="not a regular file"):
        require_file("/dev/null", "recipe", "fix")
    fake = tmp_path / "x.parquet"
    fake.write_text("not parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        open_parquet(fake, "input", DataError)


def test_missing_cloud_credentials_are_recognised_through_wrappers() -> None:
    from botocore.exceptions import NoCredentialsError

    try:
        try:
            raise NoCredentialsError()
        except NoCredentialsError as inner:
            raise OSError("fsspec wrapped it") from inner
    except OSError as outer:
        err = credentials_error(outer, "s3://bucket/x")
    assert err is not None and "no credentials to access s3://bucket/x" in err.message
    assert "AWS_ACCESS_KEY_ID" in err.fix
    assert credentials_error(OSError("timeout"), "s3://bucket/x") is None

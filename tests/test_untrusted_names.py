"""Untrusted names and paths stay data (issue 26): a source folder's file links that lead out
of it are not read, an eval spec's data stays in the spec's folder, report.md escapes what it
quotes, and rich output never reads a user string as markup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainguard.data.corpus import folder_files, iter_records, source_parts
from trainguard.evals.spec import EvalSpecError, load_spec, read_task_data


def _corpus(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "b.txt").write_text("beta\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    (src / "out.txt").symlink_to(tmp_path / "secret.txt")  # leads out: not read
    (src / "sub" / "up.txt").symlink_to("../../secret.txt")  # relative, out too
    (src / "in.txt").symlink_to("sub/b.txt")  # stays inside: read
    return src


def test_file_links_out_of_the_source_folder_are_not_read(tmp_path: Path) -> None:
    from trainguard.data.corpus import links_out

    src = _corpus(tmp_path)
    ids = [rel for rel, _ in folder_files(src)]
    assert ids == ["a.txt", "in.txt", "sub/b.txt"]
    assert links_out(src) == ["out.txt", "sub/up.txt"]
    assert "outside\n" not in [r.text for r in iter_records(str(src))]
    # the Spark engines read the parts of the same listing
    parts = source_parts(str(src))
    assert sorted(ident for part in parts for ident, _ in part.files) == ids


def test_a_source_folder_given_as_a_link_is_read(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    alias = tmp_path / "alias"
    alias.symlink_to(src)
    assert [rel for rel, _ in folder_files(alias)] == ["a.txt", "in.txt", "sub/b.txt"]


def _spec(folder: Path, data: str) -> Path:
    spec = {"name": "s", "tasks": [{"name": "t", "type": "generation", "data": data}]}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("data", ["../x.jsonl", "{abs}", "link.jsonl", "sub/../../x.jsonl"])
def test_eval_spec_data_outside_the_spec_folder_is_refused(tmp_path: Path, data: str) -> None:
    (tmp_path / "x.jsonl").write_text(json.dumps({"prompt": "a", "answer": "b"}) + "\n")
    folder = tmp_path / "specs"
    (folder / "sub").mkdir(parents=True)
    (folder / "link.jsonl").symlink_to(tmp_path / "x.jsonl")
    spec = load_spec(_spec(folder, data.format(abs=tmp_path / "x.jsonl")))
    with pytest.raises(EvalSpecError, match="outside the spec's folder"):
        read_task_data(spec, spec.tasks[0])


def test_eval_spec_data_below_the_spec_folder_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "specs"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "x.jsonl").write_text(json.dumps({"prompt": "a", "answer": "b"}) + "\n")
    spec = load_spec(_spec(folder, "data/../data/x.jsonl"))
    assert read_task_data(spec, spec.tasks[0]) == [{"prompt": "a", "answer": "b"}]


def test_report_md_escapes_names_and_messages(tmp_path: Path) -> None:
    from trainguard.report.build import render_markdown

    info = {
        "run_dir": tmp_path / "r<b>",
        "loop": "trainguard run",
        "recipe": {"name": "<img src=x onerror=alert(1)>|x"},
        "steps": [],
        "evals": [],
        "findings": [{"code": "N999", "severity": "error", "step": 3, "message": "*[a](b)* <i>"}],
        "checkpoints": [{"step": 4, "valid": False, "status": "<b>", "problem": "<script>"}],
        "skipped": ["metrics.jsonl:2: <x>"],
        "decisions": [],
        "goodput": {},
    }
    md = render_markdown(info)
    assert "<" not in md and ">" not in md.replace("&gt;", "")
    assert "&lt;img src=x onerror=alert(1)&gt;\\|x" in md
    assert "\\*\\[a\\](b)\\* &lt;i&gt;" in md


def test_findings_table_prints_markup_as_typed() -> None:
    from trainguard.cli.common import console, findings_table
    from trainguard.findings import Finding

    f = Finding.of("R101", "[/x] [b]", metric="[/y]", where="m[/b]")
    with console.capture() as out:
        console.print(findings_table([f]))
    assert all(typed in out.get() for typed in ("[/x] [b]", "[/y]", "m[/b]", "error"))


def test_a_spec_built_in_code_reads_data_anywhere(tmp_path: Path) -> None:
    from trainguard.evals.spec import EvalSpec

    (tmp_path / "x.jsonl").write_text(json.dumps({"prompt": "a", "answer": "b"}) + "\n")
    task = {"name": "t", "type": "generation", "data": str(tmp_path / "x.jsonl")}
    spec = EvalSpec.model_validate({"name": "s", "tasks": [task]})  # the caller's own spec
    assert read_task_data(spec, spec.tasks[0]) == [{"prompt": "a", "answer": "b"}]

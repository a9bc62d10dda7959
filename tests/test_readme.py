"""The README is the front door: its own-loop snippet runs as printed, and no relative link in
README.md, CONTRIBUTING.md or docs/ points at a page or a heading that is not there (the long
sections moved from the README to docs/, and links into them must follow)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, re.S)


def own_loop_snippet() -> str:
    section = README.read_text().split("## Guard your own loop", 1)[1]
    return python_blocks(section)[0]


class SquareLoss(torch.nn.Module):
    """A model whose forward returns the loss, as the snippet's `model(batch)` expects."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).pow(2).mean()


def run_snippet(max_steps: int) -> dict:
    model = SquareLoss()
    names = {
        "dataset": torch.randn(64, 4, generator=torch.Generator().manual_seed(0)),
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2),
        "max_steps": max_steps,
    }
    exec(compile(own_loop_snippet(), str(README), "exec"), names)
    names["guard"].close()
    return names


def test_the_readme_own_loop_runs_saves_and_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = run_snippet(max_steps=100)
    assert first["step"] == 100
    saved = tmp_path / "runs" / "mine" / "checkpoints" / "step-100"
    assert (saved / "manifest.json").is_file()
    second = run_snippet(max_steps=103)  # a new process would do the same: resume from 100
    assert second["step"] == 103
    assert second["sampler"].batch_hash(100) == first["sampler"].batch_hash(100)
    for a, b in zip(first["model"].parameters(), second["model"].parameters(), strict=True):
        assert not torch.equal(a, b)  # three more updates after the restored weights


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, in_code = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def test_every_relative_link_in_the_docs_resolves():
    pages = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for url in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if url.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, fragment = url.partition("#")
            target = (page.parent / path) if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(REPO)}: {url} (no such file)")
            elif fragment and target.suffix == ".md" and fragment not in anchors(target):
                broken.append(f"{page.relative_to(REPO)}: {url} (no such heading)")
    assert broken == []

"""The suite's parallel layout holds: under `pytest -n 2 --dist loadgroup` (make test), a test
marked `xdist_group(NAME)` carries `@NAME` in its node id, which is what sends every test of the
group to one worker (the timing-based tests rely on running one after the other).

pytest 9.2 stores node ids in a new attribute that pytest-xdist 3.8 does not know, so its
loadgroup scheduling silently degrades to plain load balancing; pyproject.toml keeps pytest
below 9.2 for that reason, and this test fails if the grouping stops taking effect again.
"""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("timing-serial")
def test_xdist_group_reaches_the_scheduler(request: pytest.FixtureRequest) -> None:
    worker = getattr(request.config, "workerinput", None)
    if worker is None:
        pytest.skip("not running under pytest-xdist (no scheduling to check)")
    if not getattr(request.config.option, "loadgroup", False):  # set by xdist in its workers
        pytest.skip("xdist runs without --dist loadgroup: groups are not scheduled")
    assert request.node.nodeid.endswith("@timing-serial"), (
        f"xdist_group did not reach the scheduler (node id {request.node.nodeid!r}): "
        "the installed pytest/pytest-xdist pair ignores the groups; see pyproject.toml"
    )

"""One doctor job: every rank tests itself, the ranks meet (with deadlines), test the
collectives together, and rank 0 gathers the reports and names the bad ranks.

A round, on every rank:

1. local checks, each against known answers: environment, compute (matmul, attention,
   burn), memory, storage, GPU health (NVML, kernel log). A check that raises is a finding
   (H428), never a crash;
2. a barrier through the store (deadline: `hang_timeout_s` plus three times this rank's own
   local time, so a rank merely slower than the others is not called hung): rank 0 decides who
   is missing, everyone reads the decision;
3. with everyone present, the collectives (each wait with `collective_timeout_s`);
4. the rank's report goes to the store; rank 0 collects them (deadline `hang_timeout_s`),
   analyses the fleet (`fleet.py`) and announces the findings, which every rank returns.

`--inject` rounds run one after the other in the same process group; `hang/rR` is last.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainguard.doctor.collectives import Collectives
from trainguard.doctor.compute import check_attention, check_burn, check_matmul
from trainguard.doctor.environment import check_environment
from trainguard.doctor.fleet import Fleet, bandwidth_table
from trainguard.doctor.inject import Injection
from trainguard.doctor.memory import check_memory
from trainguard.doctor.nvml import check_gpu
from trainguard.doctor.plan import DoctorPlan
from trainguard.doctor.report import LocalResult, RankContext
from trainguard.doctor.storage import check_storage
from trainguard.doctor.team import Team
from trainguard.findings import Finding, has_errors

LOCAL_CHECKS: tuple[tuple[str, Callable[[RankContext], LocalResult]], ...] = (
    ("environment", check_environment),
    ("matmul", check_matmul),
    ("attention", check_attention),
    ("burn", check_burn),
    ("memory", check_memory),
    ("storage", check_storage),
    ("gpu", check_gpu),
)
HANG_SLEEP_S = 3600.0  # `hang/rR`: far beyond any timeout; the launcher ends the process
# Figures shown per rank (the rest stay in the JSON report).
SUMMARY_FIGURES = (
    "matmul_gflops",
    "attention_ms",
    "burn_gflops",
    "host_memory_gbps",
    "device_memory_gbps",
    "storage_write_mbps",
    "storage_read_mbps",
)


@dataclass
class RoundResult:
    """One round: its fault, the findings (every rank has them), and on rank 0 the ranks'
    figures and the collectives' bandwidth."""

    index: int
    inject: str
    findings: list[Finding] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.index,
            "inject": self.inject,
            "ok": not has_errors(self.findings),
            "findings": [f.to_dict() for f in self.findings],
            "ranks": self.ranks,
            "bandwidth": self.bandwidth,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class DoctorReport:
    rounds: list[RoundResult]
    world_size: int
    backend: str
    plan: DoctorPlan

    @property
    def findings(self) -> list[Finding]:
        """Every round's findings; with several rounds each says which (`data.round`)."""
        if len(self.rounds) == 1:
            return list(self.rounds[0].findings)
        out = []
        for r in self.rounds:
            for f in r.findings:
                f.data = {**f.data, "round": r.index, "inject": r.inject}
                out.append(f)
        return out

    @property
    def hung(self) -> bool:
        """A rank did not answer: it may still be running and must be stopped."""
        return any(f.code == "H412" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            **self.plan.to_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
        }


def run_local(ctx: RankContext) -> LocalResult:
    out = LocalResult()
    for name, check in LOCAL_CHECKS:
        try:
            out.merge(check(ctx))
        except Exception as e:  # a check that cannot run is itself a finding on this rank
            message = (str(e).strip().splitlines() or [""])[0][:300]
            out.findings.append(
                ctx.who.finding(
                    "H428", f"the {name} check raised {type(e).__name__}: {message}", check=name
                )
            )
    return out


def summary(report: dict[str, Any]) -> dict[str, Any]:
    figures = report.get("figures", {})
    return {
        "rank": report["rank"],
        "host": report["host"],
        "device": report["device"],
        **{k: figures[k] for k in SUMMARY_FIGURES if k in figures},
        "timings": report.get("timings", {}),
        "seconds": round(report.get("seconds", 0.0), 3),
    }


def run_round(team: Team, plan: DoctorPlan, injection: Injection, index: int) -> RoundResult:
    ctx = RankContext(team.who(), team.device, plan, injection)
    t0 = time.perf_counter()
    if ctx.planted("kill"):
        os.kill(os.getpid(), signal.SIGKILL)  # dead, not hung: the launcher names it (R302)
    if ctx.planted("hang"):
        time.sleep(HANG_SLEEP_S)  # never joins; the others name this rank
        return RoundResult(index, injection.label)
    local = run_local(ctx)
    local_s = time.perf_counter() - t0
    report: dict[str, Any] = {
        "rank": team.rank,
        "host": ctx.who.host,
        "device": ctx.who.device,
        "findings": [f.to_dict() for f in local.findings],
        "figures": local.figures,
        "timings": local.timings,
        "seconds": local_s,
    }
    if not team.active:
        findings = Fleet({0: report}, team.hosts, team.devices, []).analyse()
        return RoundResult(
            index, injection.label, findings, [summary(report)], [], time.perf_counter() - t0
        )
    name = f"round{index}"
    wait_s = plan.hang_timeout_s + 3 * local_s
    missing = team.barrier(name, wait_s)
    if not missing:
        report["collectives"] = Collectives(team, ctx).run()
    report["seconds"] = time.perf_counter() - t0
    team.publish(f"{name}/report", report)
    if team.rank != 0:
        verdict = team.receive(f"{name}/verdict", 2 * wait_s + 30)
        if verdict is None:
            findings = [
                team.who(0).finding(
                    "H412", f"rank 0 announced no result within {2 * wait_s + 30:.0f}s"
                )
            ]
        else:
            findings = [Finding.from_dict(d) for d in verdict]
        return RoundResult(index, injection.label, findings)
    present = [r for r in range(team.size) if r not in missing]
    reports, late = team.collect(f"{name}/report", present, plan.hang_timeout_s)
    fleet = Fleet(reports, team.hosts, team.devices, missing + late)
    findings = fleet.analyse(waited_s=wait_s)
    team.publish(f"{name}/verdict", [f.to_dict() for f in findings], rank="all")
    ranks = [summary(reports[r]) for r in sorted(reports)]
    ranks += [
        {"rank": r, "host": team.hosts[r], "device": team.devices[r], "answered": False}
        for r in fleet.missing
    ]
    return RoundResult(
        index,
        injection.label,
        findings,
        sorted(ranks, key=lambda x: x["rank"]),
        bandwidth_table(reports),
        time.perf_counter() - t0,
    )


def run_doctor(team: Team, plan: DoctorPlan, rounds: list[Injection] | None = None) -> DoctorReport:
    """Every round on this rank; every rank returns the same findings, rank 0 the figures."""
    results = []
    for i, injection in enumerate(rounds or [Injection()]):
        result = run_round(team, plan, injection, i)
        results.append(result)
        if any(f.code == "H412" for f in result.findings):
            break  # a hung rank is gone from the group: later rounds cannot meet
    return DoctorReport(results, team.size, team.backend, plan)

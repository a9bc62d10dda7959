"""Rank 0's view of the fleet: every rank's report in, findings that name ranks out.

Pure functions of plain data (the reports as they arrive through the store), so each rule is
tested on synthetic fleets: a hung rank, a slow rank, a wrong contribution, a bad link, a
version or setting that differs, an oversubscribed host, a skewed clock.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from trainguard.doctor.collectives import BUS_FACTOR
from trainguard.doctor.outliers import slow_ranks
from trainguard.doctor.report import Who
from trainguard.findings import Finding

CLOCK_SKEW_S = 1.0
Reports = dict[int, dict[str, Any]]


class Fleet:
    """The reports of one round (rank -> report) and who every rank is."""

    def __init__(
        self, reports: Reports, hosts: list[str], devices: list[str], missing: list[int]
    ) -> None:
        self.reports, self.hosts, self.devices = reports, hosts, devices
        self.missing = sorted(missing)

    def who(self, rank: int) -> Who:
        return Who(rank, self.hosts[rank], self.devices[rank])

    def analyse(self, waited_s: float = 0.0) -> list[Finding]:
        return [
            *self.hung(waited_s),
            *self.local_findings(),
            *self.slow(),
            *self.software(),
            *self.settings(),
            *self.oversubscribed(),
            *self.clock_skew(),
            *self.collectives(),
        ]

    # -- ranks -----------------------------------------------------------------------------------
    def hung(self, waited_s: float) -> list[Finding]:
        return [
            self.who(r).finding(
                "H412",
                f"did not answer within {waited_s:.0f}s; the collectives were skipped",
                waited_s=round(waited_s, 1),
            )
            for r in self.missing
        ]

    def local_findings(self) -> list[Finding]:
        """The ranks' own findings; one H414 per setting with every rank that has it."""
        out: list[Finding] = []
        settings: dict[str, Finding] = {}
        for r in sorted(self.reports):
            for d in self.reports[r].get("findings", []):
                f = Finding.from_dict(d)
                if f.code != "H414":
                    out.append(f)
                    continue
                var = f.data.get("variable", f.message)
                first = settings.setdefault(var, f)
                first.data.setdefault("ranks", []).append(r)
        return out + list(settings.values())

    def slow(self) -> list[Finding]:
        metrics = sorted({m for rep in self.reports.values() for m in rep.get("timings", {})})
        per_rank: dict[int, list[str]] = {}
        detail: dict[int, dict[str, Any]] = {}
        for metric in metrics:
            times = {
                r: rep["timings"][metric]
                for r, rep in self.reports.items()
                if metric in rep.get("timings", {})
            }
            for o in slow_ranks(times):
                per_rank.setdefault(o.rank, []).append(f"{metric} {o.describe()}")
                detail.setdefault(o.rank, {})[metric] = {
                    "seconds": o.seconds,
                    "reference": o.reference,
                    "ratio": round(o.ratio, 3),
                    "z": None if o.z is None else round(o.z, 2),
                }
        return [
            self.who(r).finding("H403", "slow: " + "; ".join(per_rank[r]), timings=detail[r])
            for r in sorted(per_rank)
        ]

    # -- environment -----------------------------------------------------------------------------
    def _env(self, r: int) -> dict[str, Any]:
        return self.reports[r].get("figures", {}).get("environment", {})

    def _minority(self, values: dict[int, Any]) -> list[int]:
        """Ranks whose value differs from the most common one (ties: rank 0's, else the
        lowest rank's)."""
        if len(set(map(repr, values.values()))) <= 1:
            return []
        counts = Counter(map(repr, values.values()))
        top = max(counts.values())
        lead = min(r for r in values if counts[repr(values[r])] == top)
        return [r for r in sorted(values) if repr(values[r]) != repr(values[lead])]

    def software(self) -> list[Finding]:
        versions = {r: self._env(r).get("versions") for r in self.reports if self._env(r)}
        bad: dict[int, list[str]] = {}
        keys = sorted({k for v in versions.values() for k in (v or {})})
        for key in keys:
            values = {r: (v or {}).get(key) for r, v in versions.items()}
            for r in self._minority(values):
                bad.setdefault(r, []).append(f"{key} {values[r]}")
        return [
            self.who(r).finding(
                "H415", "runs " + ", ".join(bad[r]) + " unlike most ranks", differs=bad[r]
            )
            for r in sorted(bad)
        ]

    def settings(self) -> list[Finding]:
        comm = {r: self._env(r).get("comm", {}) for r in self.reports if self._env(r)}
        bad: dict[int, list[str]] = {}
        for key in sorted({k for c in comm.values() for k in c}):
            values = {r: c.get(key) for r, c in comm.items()}
            for r in self._minority(values):
                bad.setdefault(r, []).append(f"{key}={values[r]}")
        return [
            self.who(r).finding(
                "H416", "has " + ", ".join(bad[r]) + " unlike most ranks", differs=bad[r]
            )
            for r in sorted(bad)
        ]

    def oversubscribed(self) -> list[Finding]:
        by_host: dict[str, list[int]] = {}
        for r in self.reports:
            if self._env(r):
                by_host.setdefault(self.hosts[r], []).append(r)
        out = []
        for host, ranks in sorted(by_host.items()):
            threads = sum(int(self._env(r).get("torch_threads", 1)) for r in ranks)
            cores = min(int(self._env(r).get("cores", 1)) for r in ranks)
            if threads > cores:
                first = min(ranks)
                out.append(
                    self.who(first).finding(
                        "H417",
                        f"{len(ranks)} process(es) on {host} use {threads} threads in all on "
                        f"{cores} core(s)",
                        ranks=sorted(ranks),
                        threads=threads,
                        cores=cores,
                    )
                )
        return out

    def clock_skew(self) -> list[Finding]:
        clocks = {r: rep.get("collectives", {}).get("clock") for r, rep in self.reports.items()}
        base = clocks.get(0)
        if not base:
            return []
        out = []
        for r, seen in sorted(clocks.items()):
            if r == 0 or not seen or len(seen) != len(base):
                continue
            skew = statistics.median(a - b for a, b in zip(seen, base, strict=True))
            if abs(skew) > CLOCK_SKEW_S:
                out.append(
                    self.who(r).finding(
                        "H418",
                        f"clock {skew:+.2f}s off rank 0's ({self.hosts[0]})",
                        skew_s=round(skew, 3),
                    )
                )
        return out

    # -- collectives -----------------------------------------------------------------------------
    def collectives(self) -> list[Finding]:
        results = {
            r: rep["collectives"] for r, rep in self.reports.items() if rep.get("collectives")
        }
        if not results:
            return []
        out: list[Finding] = []
        if not self.missing:  # with a hung rank, every error is its consequence
            out += [
                self.who(r).finding("H428", f"collectives stopped: {c['error']}", error=c["error"])
                for r, c in sorted(results.items())
                if c.get("error")
            ]
        out += self._all_reduce(results)
        for op in ("all_gather", "broadcast"):
            out += self._blocks(op, results)
        for r, c in sorted(results.items()):
            rs = c.get("ops", {}).get("reduce_scatter")
            if rs and rs["wrong_elements"]:
                out.append(
                    self.who(r).finding(
                        "H410",
                        f"reduce_scatter: {rs['wrong_elements']} wrong elements received",
                        op="reduce_scatter",
                    )
                )
        for r, c in sorted(results.items()):
            for link in c.get("links", []):
                if link["wrong"]:
                    src = link["src"]
                    out.append(
                        self.who(r).finding(
                            "H411",
                            f"link from rank {src} ({self.hosts[src]}): {link['wrong']} wrong "
                            "elements arrived",
                            src=src,
                            dst=r,
                            src_host=self.hosts[src],
                        )
                    )
        return out

    def _all_reduce(self, results: dict[int, dict[str, Any]]) -> list[Finding]:
        seen_by: dict[int, list[int]] = {}
        wrong_on: list[int] = []
        for r, c in sorted(results.items()):
            ar = c.get("ops", {}).get("all_reduce")
            if not ar:
                continue
            for q in ar["bad_contributors"]:
                seen_by.setdefault(int(q), []).append(r)
            if ar["wrong_elements"]:
                wrong_on.append(r)
        out = [
            self.who(q).finding(
                "H410",
                f"all_reduce: contributed a tensor that differs from its known one (seen by "
                f"rank(s) {', '.join(map(str, seen_by[q]))}); the sum was wrong on "
                f"{len(wrong_on)} rank(s)",
                op="all_reduce",
                seen_by=seen_by[q],
                wrong_on=wrong_on,
            )
            for q in sorted(seen_by)
        ]
        if not seen_by:  # correct contributions, wrong sums: the receiving side
            out += [
                self.who(r).finding(
                    "H410",
                    "all_reduce: received a wrong sum of correct contributions",
                    op="all_reduce",
                )
                for r in wrong_on
            ]
        return out

    def _blocks(self, op: str, results: dict[int, dict[str, Any]]) -> list[Finding]:
        """A source every receiver saw wrong sent wrong data; otherwise the receivers that saw
        a wrong block are named."""
        got = {
            r: c["ops"][op]["bad_sources"] for r, c in results.items() if c.get("ops", {}).get(op)
        }
        out = []
        blamed = set()
        for q in sorted({int(q) for bad in got.values() for q in bad}):
            receivers = [r for r, bad in got.items() if str(q) in bad and r != q]
            others = [r for r in got if r != q]
            if others and len(receivers) == len(others):
                blamed.add(q)
                out.append(
                    self.who(q).finding(
                        "H410", f"{op}: every other rank received a wrong block from it", op=op
                    )
                )
        for r, bad in sorted(got.items()):
            if set(map(int, bad)) - blamed:
                out.append(
                    self.who(r).finding(
                        "H410", f"{op}: received wrong blocks from rank(s) {', '.join(bad)}", op=op
                    )
                )
        return out


def bandwidth_table(reports: Reports) -> list[dict[str, Any]]:
    """Per operation and size, the slowest rank's time (a collective ends when the last rank
    does), algorithm and bus bandwidth in GB/s."""
    world = len(reports)
    worst: dict[tuple[str, int], float] = {}
    for rep in reports.values():
        for row in rep.get("collectives", {}).get("bandwidth", []):
            key = (row["op"], row["bytes"])
            worst[key] = max(worst.get(key, 0.0), row["seconds"])
    out = []
    for (op, size), seconds in worst.items():
        algbw = size / max(seconds, 1e-12) / 1e9
        out.append(
            {
                "op": op,
                "bytes": size,
                "seconds": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * BUS_FACTOR[op](max(world, 1)),
            }
        )
    return sorted(out, key=lambda row: (row["op"], row["bytes"]))

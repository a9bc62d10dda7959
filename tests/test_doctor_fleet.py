"""Rank 0's analysis of the fleet, the `--inject` syntax, and the GPU-health judgements, on
plain data: synthetic rank reports as they arrive through the store, and NVML records and
kernel-log lines as recorded on real machines (so they are tested without a GPU)."""

from __future__ import annotations

import copy

import pytest

from trainguard.doctor.environment import suspect_settings
from trainguard.doctor.fleet import Fleet, bandwidth_table
from trainguard.doctor.inject import Injection, parse_injection, parse_rounds
from trainguard.doctor.nvml import assess, assess_xids, parse_xids, throttle_reasons
from trainguard.doctor.report import Who
from trainguard.errors import BadInputError

VERSIONS = {"python": "3.11.7", "torch": "2.13.0", "cuda": "12.4", "nccl": "2.21.5"}


def clean_report(rank: int, host: str = "node0", world: int = 4) -> dict:
    """What a healthy rank publishes: figures, timings, environment, collective results."""
    return {
        "rank": rank,
        "host": host,
        "device": f"cuda:{rank % 8}",
        "findings": [],
        "figures": {
            "environment": {
                "versions": dict(VERSIONS),
                "cores": 64,
                "torch_threads": 8,
                "comm": {"NCCL_SOCKET_IFNAME": "eth0"},
            }
        },
        "timings": {"matmul": 1.0 + 0.01 * rank, "burn": 0.5},
        "collectives": {
            "ops": {
                "all_reduce": {"ok": True, "wrong_elements": 0, "bad_contributors": {}},
                "all_gather": {"ok": True, "bad_sources": {}},
                "broadcast": {"ok": True, "bad_sources": {}},
                "reduce_scatter": {"ok": True, "wrong_elements": 0, "emulated": None},
            },
            "links": [
                {
                    "src": (rank - 1) % world,
                    "dst": rank,
                    "wrong": 0,
                    "bytes": 1024,
                    "seconds": 1e-3,
                },
                {
                    "src": (rank + 1) % world,
                    "dst": rank,
                    "wrong": 0,
                    "bytes": 1024,
                    "seconds": 1e-3,
                },
            ],
            "bandwidth": [{"op": "all_reduce", "bytes": 1 << 20, "seconds": 1e-3 * (1 + rank)}],
            "clock": [100.0, 101.0, 102.0],
        },
    }


def fleet(reports: dict[int, dict], missing: list[int] | None = None, world: int = 4) -> Fleet:
    hosts = [reports[r]["host"] if r in reports else f"node{r}" for r in range(world)]
    devices = [f"cuda:{r % 8}" for r in range(world)]
    return Fleet(reports, hosts, devices, missing or [])


def healthy(world: int = 4, hosts: list[str] | None = None) -> dict[int, dict]:
    return {r: clean_report(r, (hosts or ["node0"] * world)[r], world) for r in range(world)}


def codes_and_ranks(findings) -> list[tuple[str, int | None]]:
    return sorted((f.code, f.rank) for f in findings)


def test_a_healthy_fleet_has_no_finding() -> None:
    assert fleet(healthy()).analyse() == []


def test_a_hung_rank_is_named_with_its_host() -> None:
    reports = healthy()
    del reports[2]
    for r in reports.values():  # the collectives were skipped: nobody has results
        r.pop("collectives")
    found = fleet(reports, missing=[2]).analyse(waited_s=12)
    assert codes_and_ranks(found) == [("H412", 2)]
    assert found[0].where == "node2" and found[0].data["device"] == "cuda:2"


def test_a_slow_rank_is_named_with_its_metrics() -> None:
    reports = healthy()
    reports[3]["timings"]["matmul"] = 3.0
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H403", 3)]
    assert "matmul" in found[0].data["timings"] and "burn" not in found[0].data["timings"]


def test_a_wrong_contribution_is_blamed_on_its_rank_not_on_the_receivers() -> None:
    reports = healthy()
    for r in reports.values():  # every rank sees rank 1's block wrong and a wrong sum
        r["collectives"]["ops"]["all_reduce"] = {
            "ok": False,
            "wrong_elements": 1,
            "bad_contributors": {"1": 1},
        }
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H410", 1)]
    assert found[0].data["seen_by"] == [0, 1, 2, 3] and found[0].data["wrong_on"] == [0, 1, 2, 3]


def test_a_wrong_sum_of_correct_contributions_names_the_receiver() -> None:
    reports = healthy()
    reports[2]["collectives"]["ops"]["all_reduce"]["wrong_elements"] = 5
    assert codes_and_ranks(fleet(reports).analyse()) == [("H410", 2)]


def test_a_block_every_rank_received_wrong_blames_its_source() -> None:
    reports = healthy()
    for r in (0, 1, 3):
        reports[r]["collectives"]["ops"]["all_gather"]["bad_sources"] = {"2": 7}
    assert codes_and_ranks(fleet(reports).analyse()) == [("H410", 2)]
    # Seen wrong by one receiver only: that receiver is named.
    reports = healthy()
    reports[0]["collectives"]["ops"]["broadcast"]["bad_sources"] = {"3": 1}
    assert codes_and_ranks(fleet(reports).analyse()) == [("H410", 0)]


def test_one_bad_link_is_named_with_both_ends() -> None:
    reports = healthy()
    reports[2]["collectives"]["links"][0]["wrong"] = 3  # what rank 2 received from rank 1
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H411", 2)]
    assert (found[0].data["src"], found[0].data["dst"]) == (1, 2)


def test_different_software_names_the_minority() -> None:
    reports = healthy()
    reports[3]["figures"]["environment"]["versions"]["nccl"] = "2.18.1"
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H415", 3)]
    assert found[0].data["differs"] == ["nccl 2.18.1"]


def test_a_setting_on_one_host_only_is_a_warning() -> None:
    reports = healthy()
    reports[1]["figures"]["environment"]["comm"]["NCCL_PROTO"] = "Simple"
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H416", 1)] and found[0].severity == "warning"


def test_more_threads_than_cores_is_counted_per_host() -> None:
    reports = healthy(4, ["a", "a", "b", "b"])
    for r in (0, 1):
        reports[r]["figures"]["environment"] |= {"cores": 2, "torch_threads": 1}
    assert fleet(reports).analyse() == []  # 2 processes x 1 thread on 2 cores
    reports[1]["figures"]["environment"]["torch_threads"] = 2
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H417", 0)]
    assert found[0].data == found[0].data | {"ranks": [0, 1], "threads": 3, "cores": 2}


def test_a_skewed_clock_is_named() -> None:
    reports = healthy()
    reports[2]["collectives"]["clock"] = [t + 3.2 for t in reports[2]["collectives"]["clock"]]
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H418", 2)]
    assert found[0].data["skew_s"] == pytest.approx(3.2)


def test_collective_errors_are_named_unless_a_rank_is_missing() -> None:
    reports = healthy()
    reports[1]["collectives"]["error"] = "all_reduce: Timed out waiting 5000ms"
    assert codes_and_ranks(fleet(reports).analyse()) == [("H428", 1)]
    partial = copy.deepcopy(reports)
    del partial[3]
    assert codes_and_ranks(fleet(partial, missing=[3]).analyse()) == [("H412", 3)]


def test_the_same_bad_setting_on_every_rank_is_one_finding() -> None:
    reports = healthy()
    who = [Who(r, "node0", f"cuda:{r}") for r in range(4)]
    for r, w in enumerate(who):
        f = w.finding("H414", "NCCL_P2P_DISABLE=1: slow", variable="NCCL_P2P_DISABLE")
        reports[r]["findings"] = [f.to_dict()]
    found = fleet(reports).analyse()
    assert codes_and_ranks(found) == [("H414", 0)] and found[0].data["ranks"] == [0, 1, 2, 3]


def test_bandwidth_is_the_slowest_ranks_with_bus_factor() -> None:
    (row,) = bandwidth_table(healthy())
    assert row["seconds"] == pytest.approx(4e-3)  # rank 3's
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4)


# -- --inject ----------------------------------------------------------------------------------
def test_injections_parse_and_the_hang_runs_last() -> None:
    assert parse_injection("bad-allreduce/r3") == Injection("bad-allreduce", 3)
    assert parse_injection("none") == Injection()
    rounds = parse_rounds(["hang/r1", "none", "slow/r1"], world_size=2)
    assert [r.label for r in rounds] == ["none", "slow/r1", "hang/r1"]
    assert parse_rounds(None) == [Injection()]


@pytest.mark.parametrize(
    "text", ["bitflip", "bitflip/1", "flip/r1", "slow/r-1", "slow/r1x", "hang/r0", "", "SLOW/r1"]
)
def test_bad_injection_strings_are_bad_input(text: str) -> None:
    with pytest.raises(BadInputError) as e:
        parse_injection(text)
    assert e.value.fix


def test_an_injection_on_a_rank_the_job_lacks_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="no rank 2"):
        parse_rounds(["slow/r2"], world_size=2)
    with pytest.raises(BadInputError, match="hang"):
        parse_rounds(["hang/r1", "hang/r1"], world_size=2)


# -- NVML and Xid, on recorded values ----------------------------------------------------------
WHO = Who(3, "gpu-node-07", "cuda:3 (NVIDIA H100 80GB HBM3)")
HEALTHY_H100 = {  # read_device() on a healthy H100 SXM under load
    "name": "NVIDIA H100 80GB HBM3",
    "temperature_c": 61,
    "slowdown_c": 87,
    "sm_clock_mhz": 1980,
    "sm_clock_max_mhz": 1980,
    "clock_event_reasons": 0x4,  # the software power cap: normal at full load
    "ecc_uncorrected_volatile": 0,
    "ecc_uncorrected_aggregate": 0,
    "retired_pages_dbe": 0,
    "retired_pages_pending": False,
    "remapped_rows_uncorrectable": 0,
    "remap_pending": False,
    "remap_failure": False,
    "pcie_width": 16,
    "pcie_width_max": 16,
    "pcie_gen": 5,
    "pcie_gen_max": 5,
    "power_w": 640.2,
}


def test_a_healthy_nvml_record_has_no_finding() -> None:
    assert assess(HEALTHY_H100, WHO) == []
    unsupported = dict.fromkeys(HEALTHY_H100)  # a driver that supports none of the queries
    assert assess(unsupported, WHO) == []


@pytest.mark.parametrize(
    ("change", "code", "severity"),
    [
        ({"ecc_uncorrected_volatile": 2}, "H420", "error"),
        ({"ecc_uncorrected_aggregate": 1}, "H420", "warning"),
        ({"remap_failure": True}, "H421", "error"),
        ({"remap_pending": True}, "H421", "warning"),
        ({"retired_pages_pending": True}, "H421", "warning"),
        ({"clock_event_reasons": 0x40 | 0x4}, "H422", "warning"),
        ({"temperature_c": 84}, "H422", "warning"),
        ({"pcie_width": 8}, "H423", "warning"),
    ],
)
def test_each_nvml_fault_is_one_finding_naming_the_rank(change, code, severity) -> None:
    (f,) = assess(HEALTHY_H100 | change, WHO)
    assert (f.code, f.severity, f.rank, f.where) == (code, severity, 3, "gpu-node-07")
    assert f.data["device"].startswith("cuda:3")


def test_throttle_reason_bits() -> None:
    assert throttle_reasons(0x8 | 0x80) == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert throttle_reasons(0) == [] and throttle_reasons(None) == []


KERNEL_LOG = [  # dmesg lines as the NVIDIA driver writes them
    "[ 1021.334] NVRM: GPU at PCI:0000:3b:00: GPU-5d8e0c1a-...",
    "[ 5120.110] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    "[ 5300.002] NVRM: Xid (PCI:0000:3b:00): 13, pid=2201, Graphics SM Warp Exception",
    "[ 5300.004] NVRM: Xid (PCI:0000:3b:00): 13, pid=2201, Graphics Exception: ESR 0x5",
    "[ 6000.000] NVRM: Xid (PCI:0000:5e:00): 48, pid=0, DBE (double bit error) ECC error",
    "[ 6001.000] eth0: link up",
]


def test_xid_lines_are_parsed_per_device_and_judged() -> None:
    mine = parse_xids(KERNEL_LOG, "0000:3b:00")
    assert [x["xid"] for x in mine] == [79, 13, 13]
    assert [x["xid"] for x in parse_xids(KERNEL_LOG)] == [79, 13, 13, 48]
    found = assess_xids(mine, WHO)
    assert [(f.code, f.severity, f.data["xid"], f.data["count"]) for f in found] == [
        ("H424", "warning", 13, 2),
        ("H424", "error", 79, 1),
    ]
    assert assess_xids(parse_xids(KERNEL_LOG[-1:]), WHO) == []


def test_settings_known_to_hurt() -> None:
    env = {
        "NCCL_P2P_DISABLE": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
        "NCCL_DEBUG": "INFO",  # harmless
        "NCCL_IB_DISABLE": "0",  # harmless
        "CUDA_LAUNCH_BLOCKING": "1",
    }
    assert [v for v, _, _ in suspect_settings(env)] == [
        "NCCL_P2P_DISABLE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "CUDA_LAUNCH_BLOCKING",
    ]
    assert suspect_settings({}) == []


# -- the doctor drills' verdict ----------------------------------------------------------------
def test_doctor_drills_are_registered_before_the_multiprocess_training_drills() -> None:
    from trainguard.drills.doctor_scenarios import DOCTOR_DRILLS
    from trainguard.drills.multiproc_scenarios import MULTIPROC_DRILLS
    from trainguard.drills.scenarios import DRILLS

    names = list(DRILLS)
    assert set(DOCTOR_DRILLS) <= set(names)
    assert names[-len(MULTIPROC_DRILLS) :] == list(MULTIPROC_DRILLS)


def test_a_doctor_drill_counts_only_the_faulty_rank() -> None:
    from trainguard.drills.doctor_scenarios import judge
    from trainguard.drills.matrix import verdict

    def finding(code: str, rank: int) -> dict:
        return {"code": code, "rank": rank, "severity": "error", "where": "vm", "message": "m"}

    good = judge("doctor_slow", "slow/r1", "H403", 1, {"findings": [finding("H403", 1)]})
    assert good.ok and good.action.startswith("rank 1 (vm) named") and verdict([good]) == []
    wrong = judge("doctor_slow", "slow/r1", "H403", 1, {"findings": [finding("H403", 0)]})
    assert not wrong.ok and [f.code for f in verdict([wrong])] == ["R401", "R402"]
    hung = judge("doctor_hang", "hang/r1", "H412", 124, None)
    assert not hung.recovered and "no report" in hung.note

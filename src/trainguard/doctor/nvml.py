"""The GPU's own health record: NVML through `nvidia-ml-py` (import name `pynvml`) and Xid lines
from the kernel log.

Reading (`read_device`, `read_kernel_log`) is kept apart from judging (`assess`, `parse_xids`,
`assess_xids`): the judging functions are pure, so they are tested on recorded values on
machines without a GPU. Every NVML query is optional: a field the device or driver does not
support is None and is not judged.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from typing import Any

from trainguard.doctor.report import LocalResult, RankContext, Who
from trainguard.findings import Finding
from trainguard.metrics.environment import driver_version as driver_version
from trainguard.metrics.environment import nvml as _nvml

# NVML clock event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*).
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the device runs slower than it should; a power cap under load is normal.
BAD_THROTTLE = (
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
HOT_MARGIN_C = 5

# Xids that point at the hardware (NVIDIA's Xid catalogue); the others are usually caused by
# the application (13, 31, 43, 45) and are warnings.
HARDWARE_XIDS = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    122: "SPI PMU RPC read failure",
    123: "SPI PMU RPC write failure",
    140: "ECC unrecovered error",
}
_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+)(?:, (?P<rest>.*))?")


def _query(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # NVMLError_NotSupported and friends: the field stays unknown
        return None


def read_device(index: int = 0, uuid: str | None = None) -> dict[str, Any] | None:
    """NVML's record of one GPU as plain values (None where unsupported); None without NVML."""
    nv = _nvml()
    if nv is None:
        return None
    h = _query(lambda: nv.nvmlDeviceGetHandleByUUID(uuid)) if uuid else None
    h = h or nv.nvmlDeviceGetHandleByIndex(index)
    unc, vol, agg = (
        nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nv.NVML_VOLATILE_ECC,
        nv.NVML_AGGREGATE_ECC,
    )
    remap = _query(lambda: nv.nvmlDeviceGetRemappedRows(h))
    retire = nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    pending = _query(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
    reasons = _query(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
    if reasons is None:
        reasons = _query(lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
    name = _query(lambda: nv.nvmlDeviceGetName(h))
    return {
        "name": name.decode() if isinstance(name, bytes) else name,
        "temperature_c": _query(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "slowdown_c": _query(
            lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        ),
        "sm_clock_mhz": _query(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        "sm_clock_max_mhz": _query(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        "clock_event_reasons": reasons,
        "ecc_uncorrected_volatile": _query(lambda: nv.nvmlDeviceGetTotalEccErrors(h, unc, vol)),
        "ecc_uncorrected_aggregate": _query(lambda: nv.nvmlDeviceGetTotalEccErrors(h, unc, agg)),
        "retired_pages_dbe": _query(lambda: len(nv.nvmlDeviceGetRetiredPages(h, retire))),
        "retired_pages_pending": None if pending is None else bool(pending),
        "remapped_rows_uncorrectable": None if remap is None else remap[1],
        "remap_pending": None if remap is None else bool(remap[2]),
        "remap_failure": None if remap is None else bool(remap[3]),
        "pcie_width": _query(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
        "pcie_width_max": _query(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h)),
        "pcie_gen": _query(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        "pcie_gen_max": _query(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        "power_w": _query(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000),
    }


def throttle_reasons(mask: int | None) -> list[str]:
    if not mask:
        return []
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def assess(record: dict[str, Any], who: Who) -> list[Finding]:
    """Findings from one NVML record (`read_device`'s dict); pure."""
    out: list[Finding] = []
    g = record.get
    if g("ecc_uncorrected_volatile"):
        out.append(
            who.finding(
                "H420",
                f"{g('ecc_uncorrected_volatile')} uncorrectable ECC errors since the driver loaded",
                ecc=g("ecc_uncorrected_volatile"),
            )
        )
    elif g("ecc_uncorrected_aggregate"):
        out.append(
            who.finding(
                "H420",
                f"{g('ecc_uncorrected_aggregate')} uncorrectable ECC errors over the GPU's life",
                severity="warning",
                ecc=g("ecc_uncorrected_aggregate"),
            )
        )
    if g("remap_failure"):
        out.append(who.finding("H421", "row remapping failed: no spare rows left"))
    elif g("remap_pending") or g("retired_pages_pending"):
        what = "a row remap" if g("remap_pending") else "a page retirement"
        out.append(
            who.finding("H421", f"{what} is pending until the GPU is reset", severity="warning")
        )
    bad = [r for r in throttle_reasons(g("clock_event_reasons")) if r in BAD_THROTTLE]
    if bad:
        out.append(who.finding("H422", f"clocks throttled: {', '.join(bad)}", reasons=bad))
    temp, slowdown = g("temperature_c"), g("slowdown_c")
    if temp is not None and slowdown and temp >= slowdown - HOT_MARGIN_C:
        out.append(
            who.finding(
                "H422",
                f"{temp} C, within {HOT_MARGIN_C} C of the slowdown threshold {slowdown} C",
                temperature_c=temp,
            )
        )
    width, width_max = g("pcie_width"), g("pcie_width_max")
    if width and width_max and width < width_max:
        out.append(
            who.finding(
                "H423",
                f"PCIe link at x{width}, the device supports x{width_max}",
                width=width,
                width_max=width_max,
            )
        )
    return out


def read_kernel_log(timeout_s: float = 5.0) -> list[str] | None:
    """The kernel log's lines (`dmesg`), or None when it is not readable (no permission)."""
    try:
        proc = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.splitlines() if proc.returncode == 0 else None


def parse_xids(lines: list[str], pci: str | None = None) -> list[dict[str, Any]]:
    """Each `NVRM: Xid (PCI:0000:3b:00): N, ...` line as {"xid", "pci", "text"}; only the
    device at PCI address `pci` (e.g. `0000:3b:00`) when given; pure."""
    out = []
    for line in lines:
        m = _XID.search(line)
        if not m:
            continue
        where = m["pci"].removeprefix("PCI:").lower()
        if pci is not None and not where.startswith(pci.lower()):
            continue  # another GPU of this host: its own rank reports it
        out.append({"xid": int(m["xid"]), "pci": m["pci"], "text": (m["rest"] or "")[:200]})
    return out


def assess_xids(xids: list[dict[str, Any]], who: Who) -> list[Finding]:
    """One finding per distinct Xid number: an error for hardware Xids, else a warning."""
    out = []
    by_number: dict[int, list[dict[str, Any]]] = {}
    for x in xids:
        by_number.setdefault(x["xid"], []).append(x)
    for number, seen in sorted(by_number.items()):
        meaning = HARDWARE_XIDS.get(number)
        out.append(
            who.finding(
                "H424",
                f"Xid {number} ({meaning or 'usually caused by the application'}) "
                f"{len(seen)} time(s) in the kernel log, e.g. {seen[0]['pci']}: {seen[0]['text']}",
                severity="error" if meaning else "warning",
                xid=number,
                count=len(seen),
            )
        )
    return out


def check_gpu(ctx: RankContext) -> LocalResult:
    """NVML and the kernel log, on CUDA devices only."""
    out = LocalResult()
    if ctx.device.type != "cuda":
        return out
    import torch

    props = torch.cuda.get_device_properties(ctx.device)
    uuid = getattr(props, "uuid", None)
    record = read_device(ctx.device.index or 0, f"GPU-{uuid}" if uuid else None)
    out.figures["nvml"] = record if record is not None else "nvidia-ml-py not available"
    if record is not None:
        out.findings += assess(record, ctx.who)
    lines = read_kernel_log()
    out.figures["kernel_log"] = "not readable" if lines is None else "read"
    if lines is not None:
        out.findings += assess_xids(parse_xids(lines, pci_address(props)), ctx.who)
    return out


def pci_address(props: Any) -> str | None:
    """`0000:3b:00`, the form Xid lines use, from torch's device properties (None if unknown)."""
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
    return f"{domain:04x}:{bus:02x}:{device:02x}"

"""Hardware layer codes (H): the machine, its software, and the ranks of a job.

H101-H199 single process (environment drift); H201-H299 multi-process replicas and
stragglers; H401-H430 `trainguard doctor`.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

_DOCTOR = "trainguard doctor (docs/doctor.md)"
_SDC = "Dixit et al. 2021, Silent Data Corruptions at Scale (Meta)"
_CORES = "Hochschild et al. 2021, Cores that don't count (Google)"
_LLAMA3 = "Llama 3 report (2024), section 3.3.4: 466 interruptions in 54 days, 78% hardware"


# --- H1xx single process: hardware and environment ------------------------------------------------
register(
    Code(
        code="H101",
        title="Software drift on resume or against the reference",
        severity="warning",
        catches="A run resumed under different software than wrote its checkpoint, or a run "
        "that departs from its reference curve (R501, R502) under different software than "
        "the reference's: Python, torch, numpy, CUDA, cuDNN, NCCL, the GPU driver, trainguard, "
        "the platform, the device or the project's git revision changed (each listed with its "
        "old and new value; CUDA, cuDNN, NCCL and the driver are None on CPU).",
        why="Kernels, defaults and numerics change between versions; a resumed run is then no "
        "longer the run that was planned, and bitwise reproducibility is lost without any error. "
        "Next to a departure from the reference it names the likely cause.",
        fix="Resume (or rerun) with the environment recorded in the checkpoint's manifest (meta "
        "env) or the "
        "reference's env, or accept the drift knowingly and note it in the run log.",
        false_positives="A git revision change that touches only docs or tests.",
        references=("OLMo-core: environment logging per checkpoint",),
    ),
)

# --- H2xx multi-process: replicas and stragglers (guard/distributed/guards.py) --------------------
register(
    Code(
        code="H201",
        title="Replica divergence: a rank's parameters differ from the others",
        severity="error",
        catches="Every `distributed.replica_check_interval` steps, and before every checkpoint, "
        "all ranks hash their parameters (xxhash of the raw bytes; optionally the optimizer "
        "state) and gather the hashes. Among ranks that hold the same parameters (DDP: all; "
        "HSDP: the ranks holding one shard) a rank whose hash differs from the majority is "
        "named with its host. With two ranks there is no majority: both are named as suspects.",
        why="Data-parallel replicas must hold bitwise the same weights: they start equal and "
        "apply the same averaged gradients. A difference means silent data corruption (a bad "
        "chip or memory) or a bug that desynchronised one rank; the run goes on without any "
        "error, averaging gradients of different models, and checkpoints hold rank 0's copy only.",
        fix="The run rolls back to the newest verified checkpoint (all ranks reload it). If the "
        "same host is named again, drain it: rerun its step on other hardware to confirm.",
        false_positives="Non-deterministic kernels whose results differ per rank only when a "
        "rank computes something the others do not (e.g. per-rank buffers not synchronised).",
        references=(
            "Dixit et al. 2021, Silent Data Corruptions at Scale (Meta)",
            "Hochschild et al. 2021, Cores that don't count (Google)",
            "Gemini / PaLM reports: SDC checks by replica comparison",
        ),
    ),
    Code(
        code="H202",
        title="Straggler: the other ranks wait for one rank",
        severity="warning",
        catches="Every step each rank times its phases (data, forward, backward, optimizer): "
        "wall time and the training thread's CPU time. Every `distributed.straggler_interval` "
        "steps the ranks gather them and compare the ranks at each step: a rank's arrival at "
        "the end of a phase (its wall time since the step began, up to the collective the "
        "phase ends in) against the median of the other ranks. A rank is behind when it "
        "arrives later by more than `distributed.straggler_min_lag_s`, (1 - "
        "`distributed.straggler_threshold`) x the step time and 4 robust standard deviations "
        "of the others; CPU time compared the same way catches work the others' wait hides. "
        "Behind in `distributed.straggler_steps` steps in a row: named, with its host, the "
        "phase, the seconds behind the median and whether it was busy (CPU time) or waiting "
        "(sleep, storage, a device sync). From the first steps after warm-up: a rank slow from "
        "the start is named like one that became slow.",
        why="Data parallelism runs at the pace of the slowest rank: one throttled or failing "
        "chip, slow storage or a busy neighbour slows every step of every rank, and the others "
        "only show it as time waiting in the all-reduce.",
        fix="Check the named host and phase: `busy` points at the chip (thermal throttling, a "
        "failing device, a noisy neighbour's CPU), `waiting` at what it waits on (storage or "
        "the data loader in the data phase, a device sync, the network). `trainguard doctor` on "
        "the job's nodes (under the same torchrun) names a slow or throttled rank against the "
        "others; restart the job without it if it persists.",
        false_positives="A rank that legitimately does more work inside the timed phases "
        "(uneven data on the last batch, logging or writing on one rank only: put that outside "
        "the phases). On GPUs the CPU time is the host side only; the wall-time arrival still "
        "counts the device work the loop waits for. Slowness inside the phase that holds the "
        "collective, before it, is seen only as CPU time: a rank that sleeps there is hidden by "
        "the others' wait.",
        references=("Megatron-LM straggler detector", "Wu et al. 2024, FALCON: stragglers"),
    ),
    Code(
        code="H203",
        title="No replicas to compare: the model is fully sharded",
        severity="info",
        catches="The replica check (H201) found no two ranks that hold the same parameters: "
        "every parameter is a DTensor sharded over every rank (plain FSDP2 `fully_shard` on a "
        "1-D mesh). Said once per run, at the first check.",
        why="A replica comparison needs replicas. Fully sharded training keeps one copy of "
        "each shard, so a corrupted shard cannot be told from a healthy one by comparison, and "
        "the check would otherwise pass silently while checking nothing.",
        fix="Nothing to fix: know that silent corruption is not checked for this model. HSDP "
        "(`fully_shard` on a 2-D (replicate, shard) mesh) or DDP keep replicas, and the check "
        "compares them.",
        false_positives="None known.",
        references=("PyTorch FSDP2 `fully_shard` and HSDP (2-D device mesh)",),
    ),
)

# --- H4xx `trainguard doctor`: every rank against known answers (H401-H430) -----------------------
register(
    Code(
        code="H401",
        title="Wrong compute result: a matmul or attention block disagrees with float64",
        severity="error",
        catches="Each rank multiplies known matrices and runs a causal attention block in the "
        "recipe's dtype and compares the result with the same computation in float64. The "
        "largest error relative to the elementwise bound |A||B| (matmul) or to max|V| "
        "(attention) must stay within the dtype's rounding bound (unit roundoff of the output "
        "plus K times fp32's for a length-K accumulation); a non-finite value always fails. "
        "The finding names the rank, its host and device.",
        why="A chip that computes wrong answers silently (a marginal ALU, a bad tensor core, "
        "corrupted memory on the path) trains a wrong model at full speed, and the loss "
        "usually does not show it until much later.",
        fix="Drain the named device or host and rerun `trainguard doctor` there to confirm; "
        "replace it if it fails again. Do not resume training on it.",
        false_positives="TF32 or reduced-precision matmul modes enabled by hand widen the "
        "error; the bound accounts for TF32 when torch reports it enabled.",
        references=(_SDC, _CORES, _DOCTOR),
    ),
    Code(
        code="H402",
        title="Not repeatable: the same computation gave different bits twice",
        severity="error",
        catches="Each compute check runs twice on the same inputs; the two results must be "
        "bitwise equal on the same device.",
        why="Deterministic kernels on the same inputs give the same bits. A difference is an "
        "intermittent fault (the worst kind: it passes most checks), or a non-deterministic "
        "kernel that breaks bitwise resume.",
        fix="Rerun `trainguard doctor` on the named device; if it repeats, drain it. If it "
        "comes from a known non-deterministic kernel, set torch.use_deterministic_algorithms.",
        false_positives="Non-deterministic GPU kernels (atomics) chosen by cuBLAS/cuDNN "
        "heuristics on some shapes.",
        references=(_CORES, _DOCTOR),
    ),
    Code(
        code="H403",
        title="Slow rank: its timing is an outlier among the ranks",
        severity="error",
        catches="Every rank times the same matmuls, attention block, sustained burn and "
        "memory fill (CPU time of the process on CPU, so a rank that waits for a shared core "
        "is not blamed; synchronised wall time on GPU). A rank is named when its time is an "
        "outlier: with 8 or more ranks a robust z-score (median and MAD over the fleet) above "
        "3.5 and at least 1.25x the median; with fewer ranks at least 1.5x the median of the "
        "others.",
        why="Data parallelism runs at the pace of the slowest rank: one throttled or failing "
        "device slows every step of the whole job.",
        fix="Check the named host: thermal or power throttling (H418), a degraded PCIe link "
        "(H420), a noisy neighbour, a different CPU or clock setting. Restart the job "
        "without it if it persists.",
        false_positives="A heterogeneous fleet (different device models): compare like with "
        "like. Another job sharing the device.",
        references=("Megatron-LM straggler detector", "Wu et al. 2024, FALCON: stragglers"),
    ),
    Code(
        code="H404",
        title="Throughput fell during a sustained burn (throttling)",
        severity="warning",
        catches="A short burn of back-to-back matmuls, timed in four quarters: the last "
        "quarter more than 1.5x slower than the first.",
        why="A device that slows down under sustained load (thermal or power limits, a failing "
        "fan) passes short checks and then drags the run.",
        fix="Check cooling and power limits of the named device (NVML's throttle reasons, "
        "H418); rerun the full `trainguard doctor` (a longer burn).",
        false_positives="Another process starting on the same device mid-burn.",
        references=(_DOCTOR,),
    ),
    Code(
        code="H405",
        title="Memory does not hold what was written",
        severity="error",
        catches="A buffer (host memory; device memory on CUDA) filled with fixed patterns "
        "(0x55.., 0xAA..) and an address-dependent pattern, then read back and compared.",
        why="Bad memory corrupts weights, gradients or optimizer state silently; ECC catches "
        "single-bit errors only where it exists and is enabled.",
        fix="Drain the named host or device; run a full memory test (memtest86, NVIDIA's field "
        "diagnostics) before returning it to service.",
        references=(_SDC, _DOCTOR),
    ),
    Code(
        code="H410",
        title="Wrong collective result: a rank's contribution or received result is wrong",
        severity="error",
        catches="All-reduce, all-gather, broadcast and reduce-scatter of known tensors whose "
        "exact results every rank checks. The contributions to the all-reduce are gathered, "
        "so a wrong sum is blamed on the rank that contributed a wrong tensor; a rank that "
        "received a wrong result from correct contributions is named itself.",
        why="A corrupting NIC, switch, driver or a bad device turns every gradient average "
        "into garbage on all ranks at once, with no error raised.",
        fix="Drain the named rank's host; if no contributor is wrong but results are, check "
        "the network path and NCCL/driver versions (H412).",
        false_positives="None: the inputs and results are exact in the tested dtype.",
        references=("NCCL tests (nccl-tests), correctness mode", _DOCTOR),
    ),
    Code(
        code="H411",
        title="Bad link: a ring neighbour's message arrived wrong or not at all",
        severity="error",
        catches="Every rank sends a known tensor to both ring neighbours and checks what it "
        "receives from them, with a timeout: a wrong or missing message names the link (the "
        "receiving rank in `rank`, both ends in `data`).",
        why="A single bad link (a cable, a NIC, an NVLink lane) slows or corrupts only the "
        "collectives that cross it; whole-job collectives cannot say which one.",
        fix="Check the link between the two named hosts (cables, NIC counters, NVLink status); "
        "when one rank is at both ends of several bad links, that rank's host is the suspect.",
        references=(_DOCTOR,),
    ),
    Code(
        code="H412",
        title="Hung rank: a rank did not answer within the timeout",
        severity="error",
        catches="The ranks meet at timed barriers (through the process group's key-value "
        "store, so nobody waits forever); a rank that does not arrive within "
        "`distributed.hang_timeout_s` (plus three times the others' own check time) is named "
        "with its host, and the collectives are skipped.",
        why="A hung rank stalls every collective of the job, and a collective timeout names no "
        "culprit.",
        fix="Read the named rank's stack (py-spy dump, or the stack dump of a `trainguard run` "
        "hang); drain its host if it hangs again.",
        false_positives="A rank far slower than the timeout (raise `distributed.hang_timeout_s`).",
        references=("torch.distributed.monitored_barrier", _DOCTOR),
    ),
    Code(
        code="H413",
        title="Storage check failed: write, fsync, read back or checksum",
        severity="error",
        catches="Every rank writes a file in the checkpoint directory (or its nearest existing "
        "parent), fsyncs it, reads it back and compares checksums; with a URL "
        "`checkpoint.dir` the same through fsspec on the object store. A store that does not "
        "answer within `distributed.hang_timeout_s` is reported, not waited for.",
        why="A checkpoint that cannot be written, or comes back different, is found at the "
        "worst moment: when it is needed.",
        fix="Check the path's permissions and free space, the URL's credentials, endpoint and "
        "network (storage_options); rerun the doctor.",
        references=(_DOCTOR,),
    ),
    Code(
        code="H414",
        title="Settings known to cause hangs or slowness",
        severity="warning",
        catches="NCCL and torch.distributed environment variables with known bad effects "
        "(NCCL_P2P_DISABLE=1, NCCL_IB_DISABLE=1, TORCH_NCCL_ASYNC_ERROR_HANDLING=0, "
        "CUDA_LAUNCH_BLOCKING=1, ...; the list is in doctor/environment.py with each reason).",
        why="Left over from debugging, these make collectives several times slower or turn a "
        "dead rank into a job that hangs forever.",
        fix="Unset the named variables unless you need them on purpose.",
        references=("NCCL environment variables documentation", _DOCTOR),
    ),
    Code(
        code="H415",
        title="Ranks run different software",
        severity="error",
        catches="Python, torch, CUDA, cuDNN, NCCL, driver or trainguard versions that differ "
        "between ranks; the ranks not in the majority are named.",
        why="Different collective libraries or kernels on different ranks hang (protocol "
        "mismatch) or compute subtly different results; replicas drift apart.",
        fix="Install the same versions on every host (one container image).",
        references=(_DOCTOR,),
    ),
    Code(
        code="H416",
        title="Communication settings differ between ranks",
        severity="warning",
        catches="NCCL_*, TORCH_NCCL_*, TORCH_DISTRIBUTED_*, GLOO_*, OMP_NUM_THREADS or "
        "CUDA_LAUNCH_BLOCKING set differently on some ranks.",
        why="A variable set on one host only (a different protocol, buffer size or timeout) is "
        "a classic source of hangs and of one slow rank.",
        fix="Set the same environment on every host (the launcher's environment or the image).",
        references=(_DOCTOR,),
    ),
    Code(
        code="H417",
        title="More threads or processes than cores",
        severity="warning",
        catches="On a host, the sum over its ranks of torch's intra-op threads exceeds the "
        "cores this process may run on (its CPU affinity), e.g. more processes than cores.",
        why="Oversubscribed cores make every step several times slower and make timings (and "
        "straggler detection) meaningless.",
        fix="Use at most one process per core and set OMP_NUM_THREADS (or train.threads) so "
        "processes x threads <= cores.",
        references=(_DOCTOR,),
    ),
    Code(
        code="H418",
        title="Clock skew between hosts",
        severity="warning",
        catches="The ranks read their wall clocks right after a common collective; a host "
        "more than 1 s off rank 0's clock is named.",
        why="Skewed clocks scramble the order of log lines across hosts and can make "
        "time-based rendezvous keep-alives (torchrun) declare a live node dead.",
        fix="Run NTP/chrony on every host.",
        references=(_DOCTOR,),
    ),
    Code(
        code="H420",
        title="GPU memory errors: uncorrectable ECC errors",
        severity="error",
        catches="NVML (nvidia-ml-py) uncorrected ECC error counts: volatile (since the driver "
        "loaded) is an error, aggregate (lifetime) only a warning.",
        why="An uncorrectable ECC error means data in device memory was lost: a kernel read "
        "garbage or the job was killed.",
        fix="Drain the GPU; reset it and rerun the doctor; replace it if errors return.",
        references=("NVIDIA GPU memory error management (dcgm, nvidia-smi -q -d ECC)", _LLAMA3),
    ),
    Code(
        code="H421",
        title="GPU memory retirement: retired pages or remapped rows pending or failed",
        severity="error",
        catches="NVML retired pages (pending retirement) and remapped rows (pending remap, or "
        "a remapping failure).",
        why="A pending retirement or remap takes effect only after a GPU reset; until then the "
        "bad memory is still used. A remap failure means the GPU ran out of spare rows.",
        fix="Reset the GPU (drain the node first) for pending remaps; replace the GPU after a "
        "remapping failure.",
        references=("NVIDIA A100/H100 row remapping documentation", _LLAMA3),
    ),
    Code(
        code="H422",
        title="GPU throttling or running hot",
        severity="warning",
        catches="NVML clock event (throttle) reasons: hardware slowdown, hardware thermal or "
        "power-brake slowdown, software thermal slowdown; or a temperature within 5 C of the "
        "slowdown threshold.",
        why="A throttled GPU is a straggler: the whole job runs at its pace.",
        fix="Check cooling (fans, airflow, inlet temperature) and power delivery of the named "
        "host.",
        false_positives="The software power cap alone is normal under full load and is not "
        "reported.",
        references=("NVML clocks event reasons", _DOCTOR),
    ),
    Code(
        code="H423",
        title="PCIe link degraded: fewer lanes than the device supports",
        severity="warning",
        catches="NVML's current PCIe link width below the maximum width.",
        why="A link trained at x8 or x4 instead of x16 halves or quarters host-device and "
        "GPUDirect bandwidth: data loading and checkpoints slow down on that rank.",
        fix="Reseat the card or riser; check the slot and BIOS settings.",
        false_positives="Some GPUs lower the link generation at idle (not its width); only the "
        "width is checked.",
        references=(_DOCTOR,),
    ),
    Code(
        code="H424",
        title="GPU errors (Xid) in the kernel log",
        severity="error",
        catches="NVRM Xid lines in the kernel log (when readable): Xids that point at the "
        "hardware (48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, "
        "92-95 ECC, 119/120 GSP, ...) are errors, others warnings.",
        why="Xid events are the driver's record of device faults; they often precede the "
        "failures that kill a run.",
        fix="Look up the Xid in NVIDIA's Xid catalogue; drain the device for hardware Xids.",
        false_positives="Application-caused Xids (13, 31, 43: a bad kernel or an illegal "
        "address in user code) are warnings.",
        references=("NVIDIA Xid errors catalogue", _LLAMA3),
    ),
    Code(
        code="H428",
        title="A doctor check raised an error on a rank",
        severity="error",
        catches="A check that failed with an exception instead of an answer (a CUDA error, an "
        "out-of-memory, a collective that raised).",
        why="A check that cannot run on one rank is itself a sign that the rank is not "
        "healthy, or that its setup differs from the others.",
        fix="Read the error in the finding; rerun `trainguard doctor` on that host.",
        references=(_DOCTOR,),
    ),
    Code(
        code="H429",
        title="The doctor's processes ended without a report",
        severity="error",
        catches="`trainguard doctor --nproc N`: the local processes exited without rank 0's "
        "report (a crash, a kill).",
        why="Without a report nothing is known about the ranks; a crash on start-up is itself "
        "a fault of the machine or its setup.",
        fix="Read the processes' error output above the report; rerun with --nproc 1.",
        references=(_DOCTOR,),
    ),
)

"""Checkpoint layer codes (C): saving, verifying, loading and resuming.

C101-C119 verified checkpoints; C120-C139 the public Checkpointer; C150-C159 resume;
C201-C299 object storage.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

_CHECKSUMS = (
    "Zhang et al., 'OPT: Open Pre-trained Transformer Language Models' (2022) and the OPT-175B "
    "logbook: many restarts from the last checkpoint after hardware failures",
    "Gupta et al., 'Just-In-Time Checkpointing: Low Cost Error Recovery from Deep Learning "
    "Training Failures' (EuroSys 2024)",
)
_POSIX = (
    "Pillai et al., 'All File Systems Are Not Created Equal: On the Complexity of Crafting "
    "Crash-Consistent Applications' (OSDI 2014): write, fsync, rename, fsync the directory",
)
_BACKOFF = (
    "AWS Architecture Blog, 'Exponential Backoff And Jitter' (Brooker, 2015)",
    "Amazon S3 docs, 'Best practices design patterns: optimizing Amazon S3 performance' "
    "(503 SlowDown, per-prefix request rates)",
)
_PICKLE = (
    "Python docs, 'pickle - Python object serialization': 'The pickle module is not secure. "
    "Only unpickle data you trust.' (Restricting Globals)",
    "PyTorch docs, torch.load(weights_only=True) and torch.distributed.checkpoint "
    "(FileSystemReader reads `.metadata` with pickle.load)",
)
_DCP = (
    "PyTorch docs, 'Distributed Checkpoint - torch.distributed.checkpoint' (load-time "
    "resharding, Stateful, get_state_dict/set_state_dict)",
    "torchtitan, components/checkpoint.py: DCP with Stateful model/optimizer wrappers",
)


# What to do about C107 on each side: raised by `trainguard run` (train/start.py) and by a
# Checkpointer in the user's own loop (checkpoint/load_checks.py); the entry's fix holds both.
C107_IN_RUN = (
    "`trainguard run` stops (exit 1) and changes nothing. Restore a good copy of a checkpoint "
    "from backup and run again, or start over on purpose with `trainguard run --fresh`, which "
    "moves the run dir's contents to RUN_DIR/attic/<timestamp>/ (nothing is deleted)."
)
C107_IN_LOOP = (
    "`Checkpointer.load_latest` raises NoUsableCheckpoint (exit 1 under trainguard's CLI) and "
    "changes nothing in {folder}. Restore a good copy of a step from backup into {folder} and "
    "load again, or start over on purpose by giving a Checkpointer a new folder; keep "
    "{folder} as evidence (nothing is deleted for you)."
)


# --- C101-C119 verified checkpoints, C201-C299 object storage -------------------------------------
register(
    Code(
        code="C101",
        title="Checkpoint file is corrupt (checksum mismatch)",
        severity="error",
        catches="A file of a committed checkpoint whose xxh3-128 checksum differs from the one "
        "recorded in its manifest when it was written.",
        why="Resuming from flipped bits (a bad disk, a bad copy, an interrupted sync) silently "
        "trains on from wrong weights or optimizer moments; the loss may look fine for a while.",
        fix="Nothing to do for the run: the loader falls back to the previous valid checkpoint, "
        "and the next save moves the damaged step to checkpoints/quarantine/ (kept as "
        "evidence). Check the disk or copy path that damaged the file.",
        false_positives="None: the manifest is itself checksummed, so a mismatch means the file "
        "changed after it was written.",
        references=_CHECKSUMS,
    ),
    Code(
        code="C102",
        title="Checkpoint file has the wrong size (truncated or appended)",
        severity="error",
        catches="A file of a committed checkpoint whose size differs from its manifest entry.",
        why="A truncated file is the typical trace of a writer killed mid-copy or a disk that "
        "filled; loading it fails late or, worse, loads a prefix.",
        fix="The loader falls back to the previous valid checkpoint; free disk space and check "
        "whatever copied or synced the folder.",
        references=_CHECKSUMS,
    ),
    Code(
        code="C103",
        title="Checkpoint file listed in the manifest is missing",
        severity="error",
        catches="A file named in a checkpoint's manifest that is not in its folder.",
        why="A partial copy or a hand-made cleanup left a checkpoint that cannot restore the "
        "whole training state (for example weights without optimizer moments).",
        fix="The loader falls back to the previous valid checkpoint and the next save moves "
        "the incomplete step to checkpoints/quarantine/; restore the missing file from its "
        "source if you need that step.",
        references=_CHECKSUMS,
    ),
    Code(
        code="C104",
        title="Checkpoint manifest missing, unreadable or edited",
        severity="error",
        catches="A step folder whose manifest.json is absent, is not valid JSON (truncated), "
        "lacks required fields, or whose self-checksum does not match its content (edited).",
        why="The manifest is the commit marker: without a trustworthy one nothing says the "
        "folder was completely written, so it must never be loaded.",
        fix="The loader skips the folder and uses the previous valid checkpoint; the next save "
        "moves it to checkpoints/quarantine/. Never edit a manifest by hand.",
        false_positives="A manifest written by a newer trainguard with a different format.",
        references=_POSIX,
    ),
    Code(
        code="C105",
        title="Checkpoint manifest names a different step than its folder",
        severity="error",
        catches="step-<N>/manifest.json whose `step` field is not N (a folder renamed or copied "
        "over another).",
        why="Resuming from the wrong step replays or skips data and desynchronises the "
        "learning-rate schedule without any error.",
        fix="The loader skips the folder and the next save moves it to "
        "checkpoints/quarantine/; to use it, rename it back to the step its manifest names.",
        references=_CHECKSUMS,
    ),
    Code(
        code="C106",
        title="Checkpoint save failed",
        severity="error",
        catches="A checkpoint that could not be written: disk full, file too large for a "
        "limit, permission denied, a root that is not a directory.",
        why="A run that keeps training without durable checkpoints loses everything since the "
        "last good one at the next crash.",
        fix="Free disk space, raise the quota or file size limit, or point the checkpoints at a "
        "writable place (`checkpoint.dir` in a `trainguard run` recipe, the Checkpointer's "
        "path in your own loop). The previous checkpoint is untouched and the partial one "
        "removed.",
        references=_POSIX,
    ),
    Code(
        code="C107",
        title="No valid checkpoint although committed ones exist",
        severity="error",
        catches="Checkpoints exist but every one of them failed verification or could not be "
        "loaded; the finding lists each step and why. Also a run dir whose metrics.jsonl "
        "records committed checkpoints (a `checkpoint` event, or the end of a finished run) "
        "while the checkpoint folder holds none: deleted or moved.",
        why="Auto-resume would silently start from scratch and overwrite the run's history: "
        "metrics.jsonl truncated, the damaged folders (the evidence) pruned, the whole run "
        "trained again.",
        fix=f"{C107_IN_RUN} In your own loop: "
        + C107_IN_LOOP.format(folder="the Checkpointer's folder"),
        references=_CHECKSUMS,
    ),
    Code(
        code="C108",
        title="Checkpoint manifest names a path outside its folder",
        severity="error",
        catches="A manifest.json whose file list holds an absolute path, a `..`, `.` or empty "
        "path component, a backslash or a control character: anything but a plain relative "
        "path inside the step folder. The step is rejected before any file is opened, "
        "downloaded or written.",
        why="The manifest is data anyone who can write the folder (or the bucket) can forge; "
        "its self-checksum proves integrity, not authenticity. Followed, such a name reads "
        "files outside the checkpoint (/dev/zero hangs the run) or, on object storage, writes "
        "a download outside the local cache.",
        fix="The loader falls back to the previous valid checkpoint. Find out who or what "
        "wrote the manifest: trainguard never writes such names.",
        false_positives="None: trainguard writes only plain relative names.",
        references=(
            "CWE-22: Improper Limitation of a Pathname to a Restricted Directory "
            "('Path Traversal')",
        ),
    ),
    Code(
        code="C109",
        title="Checkpoint file is not a regular file",
        severity="error",
        catches="A manifest entry (or the manifest) that is a symbolic link, or reached through "
        "one, or a FIFO, device, socket or folder. It is never opened or read.",
        why="A symlink points the checkpoint at a file outside it, which then verifies against "
        "whatever it points to; reading a device or FIFO can block forever before the hang "
        "watchdog even starts.",
        fix="The loader falls back to the previous valid checkpoint and the next save moves the "
        "step to checkpoints/quarantine/. Copy checkpoints with their files (cp -L, rsync -L), "
        "not as links.",
        false_positives="Checkpoint folders deliberately assembled from symlinks to save space; "
        "trainguard does not support that.",
        references=("CWE-59: Improper Link Resolution Before File Access ('Link Following')",),
    ),
    Code(
        code="C110",
        title="Entry in the checkpoint folder that is not a checkpoint",
        severity="warning",
        catches="Anything in a checkpoint root other than canonical step-<N> folders (N in "
        "decimal without leading zeros), trainguard's temp folders, quarantine/ and attic/: "
        "step-old, step-20.bak, step-0020, a file named step-5, a symlinked step folder.",
        why="A hand-made copy such as step-0020 must not stand in for step 20, and junk must "
        "never crash a resume or a report; ignoring it silently would hide a copy someone "
        "meant to keep.",
        fix="Nothing to do for the run: the entry is ignored and left in place. Move it out of "
        "the checkpoint folder if it is not needed there.",
        false_positives="Files you keep next to the checkpoints on purpose.",
        references=_CHECKSUMS,
    ),
    Code(
        code="C111",
        title="Checkpoint verifies but cannot be loaded",
        severity="error",
        catches="A checkpoint whose files match their checksums but do not load: state.json "
        "that is not valid or not what trainguard writes, state keys, weights or optimizer "
        "moments whose names or tensor shapes differ from the model, a sampler order or "
        "generator states that do not fit (checked before anything loads), a file the manifest "
        "does not list, or (framework folders) a pickle holding Python objects (trainguard "
        "loads tensors only). The finding names the file.",
        why="A manifest can be rewritten to bless any content; loading a pickle would run "
        "arbitrary code, and a crash on load leaves the run unable to resume from anything.",
        fix="The loader falls back to the previous checkpoint and the next save moves the step "
        "to checkpoints/quarantine/. Never unpickle such a file to get at its contents (that "
        "runs whatever code it holds): find out what wrote it.",
        false_positives="A checkpoint written by a different model or optimizer configuration "
        "(resume with the run's own recipe).",
        references=(
            "PyTorch docs, torch.load: weights_only=True restricts unpickling to tensors and "
            "primitive types",
        ),
    ),
    Code(
        code="C112",
        title="Checkpoint that failed verification moved to quarantine",
        severity="info",
        catches="Retention (or a save of the same step) moved a step that failed verification "
        "or loading to checkpoints/quarantine/step-<N>/ (quarantine/ under the root URL on "
        "object storage) instead of deleting it.",
        why="The damaged copy is the evidence of what went wrong (a disk, a copy tool, an "
        "edit); deleting it loses that, and the scan never loads from quarantine/.",
        fix="Nothing to do for the run. quarantine/ keeps the damaged copies until you have "
        "found the cause; trainguard never loads from it nor clears it.",
        references=_CHECKSUMS,
    ),
    Code(
        code="C113",
        title="Run started over on purpose (--fresh)",
        severity="info",
        catches="`trainguard run --fresh` moved the run dir's previous contents (metrics, "
        "checkpoints, reports) to RUN_DIR/attic/<timestamp>/, and the step folders of an "
        "external checkpoint.dir to its attic/<timestamp>/, before starting from step 0.",
        why="Starting over must be explicit and must never destroy the previous run's history.",
        fix="Nothing to do; the previous run is in the folder the finding names.",
        references=_POSIX,
    ),
    Code(
        code="C201",
        title="Checkpoint upload failed after retries",
        severity="error",
        catches="An object-store transfer that still failed after the configured attempts with "
        "exponential backoff and jitter, or failed with a permanent error (access denied, no "
        "such bucket).",
        why="Without a durable remote copy a lost node loses the run; a half-uploaded step must "
        "never be mistaken for a checkpoint.",
        fix="Check credentials, bucket and endpoint; raise retry attempts or lower the upload "
        "rate if the store answers SlowDown/503 (in your own loop: "
        "`Checkpointer(retry=RetryPolicy(attempts=...), rate_limit_mb_s=...)`). The manifest "
        "was not uploaded, so the partial step is never loaded.",
        references=_BACKOFF,
    ),
    Code(
        code="C202",
        title="Uploaded object does not match the local file",
        severity="warning",
        catches="After an upload, the remote object's size (or read-back checksum) differs from "
        "the local file; the file was uploaded again.",
        why="Object stores and proxies can truncate or mangle bodies; pruning older checkpoints "
        "on the strength of an unverified upload can leave no good copy at all.",
        fix="Usually nothing (the retry fixed it). If it repeats, check proxies, the endpoint "
        "and multipart settings.",
        references=_BACKOFF,
    ),
    Code(
        code="C203",
        title="Transient storage errors were retried",
        severity="warning",
        catches="A checkpoint save or load that needed retries (timeouts, connection resets, "
        "503 SlowDown) to succeed.",
        why="Retries are the early sign of an overloaded store: many ranks writing at once is "
        "how shared storage gets throttled into failing whole runs.",
        fix="Stagger ranks further and rate-limit uploads (in your own loop: "
        "`Checkpointer(retry=RetryPolicy(stagger_s=...), rate_limit_mb_s=...)`), or save less "
        "often (`checkpoint.interval` in a `trainguard run` recipe).",
        false_positives="Isolated retries on a busy but healthy network.",
        references=_BACKOFF,
    ),
    Code(
        code="C204",
        title="Partial remote checkpoint without a manifest",
        severity="warning",
        catches="A step prefix on the object store holding objects but no manifest.json: an "
        "upload that was killed before its commit marker.",
        why="It is never loaded (correct), but it wastes storage and tells of writers dying "
        "mid-upload.",
        fix="Nothing to do: it is an upload that never committed (like a local temp folder), "
        "so retention removes it once a newer checkpoint is verified.",
        references=_BACKOFF,
    ),
    Code(
        code="C205",
        title="Local checkpoint cache was stale or damaged",
        severity="info",
        catches="The cached copy of a remote checkpoint failed verification or did not match "
        "the remote manifest, so it was downloaded again.",
        why="A damaged cache must not be trusted over the object store; the re-download costs "
        "time, not correctness.",
        fix="Nothing to do; if it repeats, check the cache disk.",
        references=_CHECKSUMS,
    ),
)

# --- C120-C139 the public Checkpointer (checkpoint/checkpointer.py) -------------------------------
register(
    Code(
        code="C120",
        title="Checkpoint metadata refused: not plain DCP metadata",
        severity="error",
        catches="A sharded checkpoint whose `.metadata` (DCP's pickle) names anything but DCP's "
        "own metadata classes and torch dtypes/sizes/layouts, such as os.system, "
        "builtins.eval or subprocess: a pickle that would run code when loaded.",
        why="DCP reads `.metadata` with a bare pickle.load, so a planted or tampered file runs "
        "arbitrary code on every rank that resumes. A manifest checksum does not help against "
        "someone who can rewrite the manifest too.",
        fix="Nothing runs: the step is skipped and the previous valid checkpoint loaded. Find "
        "out who could write to the checkpoint storage; do not load the step with plain DCP.",
        false_positives="A checkpoint written by a newer torch whose metadata uses a class "
        "this version does not know; load it with that torch version.",
        references=_PICKLE,
    ),
    Code(
        code="C121",
        title="Resumed on a different number of ranks",
        severity="info",
        catches="A Checkpointer resume whose world size differs from the one the checkpoint "
        "was saved with.",
        why="Ranks that had no saved state get random generator states derived from the "
        "saved seed (documented in checkpoint/rng.py), so dropout and sampling streams differ "
        "from an uninterrupted run on those ranks; the audit trail should say so.",
        fix="Nothing to do if the change of world size was intended. Sharded state is "
        "resharded by DCP; replicated state is identical on every rank.",
        references=_DCP,
    ),
    Code(
        code="C123",
        title="A rank stopped answering during a checkpoint save or load",
        severity="error",
        catches="A collective step of a Checkpointer save or load (gathering every rank's "
        "checksums, the commit decision, the chosen step) that failed because a rank died or "
        "stopped answering.",
        why="A sharded checkpoint is only complete when every rank has written its shards; "
        "committing without one rank's files would produce a checkpoint that cannot be "
        "restored.",
        fix="Restart the job: no manifest was written for the interrupted step, so it resumes "
        "from the last committed checkpoint. If the same rank keeps dying, check its host.",
        references=_DCP,
    ),
    Code(
        code="C124",
        title="Checkpoint skipped: the queue of background writes was full",
        severity="info",
        catches="An asynchronous save that came while as many earlier snapshots as the queue "
        "holds (`Checkpointer(queue=N)`, `checkpoint.queue`) were still queued or being "
        "written, with `when_full='skip'` (`checkpoint.when_full: skip`): nothing was saved "
        "for that step.",
        why="Saving anyway would stop the loop until storage caught up, the stall the setting "
        "was chosen to avoid; but a failure now loses the steps back to the newest committed "
        "checkpoint, so the effective interval is longer than the one asked for.",
        fix="Nothing is lost: the earlier snapshots are still written, and the last save of a "
        "run always waits. For a checkpoint at every interval use `when_full: wait`, a longer "
        "queue (memory: one copy of the state per slot), a longer interval or faster storage.",
        references=(
            "Mohan et al., 'CheckFreq: Frequent, Fine-Grained DNN Checkpointing' (FAST 2021): "
            "snapshot in memory, persist in the background, adapt the frequency to the cost",
            "Wang et al., 'Gemini: Fast Failure Recovery in Distributed Training with "
            "In-Memory Checkpoints' (SOSP 2023)",
        ),
    ),
)

# --- C150-C159 resume (the run's orchestration) ---------------------------------------------------
register(
    Code(
        code="C150",
        title="Resumed from a checkpoint",
        severity="info",
        catches="The run found a valid checkpoint in its run dir and continued from it.",
        why="Auto-resume is how a crashed or preempted run gets back without lost work; the "
        "finding records where it picked up so the metric log and report can be audited.",
        fix="Nothing to do. Start a fresh run with a new --run-dir if this was not intended.",
    ),
)

"""Codes of the public Checkpointer (checkpoint/checkpointer.py): C120-C139. Never renumber."""

from trainguard.codes import Code, register

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
)

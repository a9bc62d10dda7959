"""What `trainguard watch` accepts, named in its messages, and how a TensorBoard event file is
named: shared by the format detection (`formats.py`) and the TensorBoard reader
(`tensorboard_read.py`), which `formats` loads only when it meets an event file."""

ACCEPTED = (
    "a run dir with a run record (metrics.jsonl), JSON Lines (.jsonl), CSV/TSV with a header, "
    "a TensorBoard event file or run folder, "
    "a Hugging Face trainer_state.json (or the checkpoint folder holding it), "
    "or a W&B chart's Export CSV"
)
EVENT_GLOB = "events.out.tfevents*"

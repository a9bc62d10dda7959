"""D140-D149: what `trainguard batch RUN_DIR --step N` finds in the global batch of a step.

Never reuse or renumber a code.
"""

from trainguard.codes import Code, register

register(
    Code(
        code="D140",
        title="A sample of the batch comes from a document the data filters reject",
        severity="warning",
        catches="A sample of the decoded global batch of a step whose text lies (partly) in a "
        "document that the quality rules of `trainguard data filter` (D210-D240, Gopher's "
        "thresholds) would reject: repeated lines, broken encoding, symbol soup, dangling "
        "references.",
        why="A loss or gradient spike often has a cause in the data: a block of repeated lines, "
        "a binary file decoded as text, a table of numbers. Seeing that the batch behind a "
        "spike holds a rejected document turns a guess into a cause, and says which document "
        "to remove.",
        fix="Read the sample's text and the flags; if the document is junk, filter the source "
        "(`trainguard data filter SOURCE --out KEPT`) and train on the kept file.",
        false_positives="Code and tables fail prose rules (alphabetic words, symbol ratio) by "
        "design; in a code corpus those flags are expected, and document-level rules judge the "
        "whole document, not the sample's slice of it.",
        references=("Rae et al. 2021, Gopher, appendix A.1.1",),
    ),
    Code(
        code="D141",
        title="The decoded batch is not the batch the run trained on",
        severity="error",
        catches="The hash of the global batch `trainguard batch` decoded (sample ids from the "
        "logged position in the elastic order) differs from the `batch_hash` the run logged "
        "for that step.",
        why="The prepared data found for the run is not the data it was trained on (another "
        "source, another tokenizer), or the log was edited: the text shown would not be what "
        "the model saw, so nothing said about the batch can be trusted.",
        fix="Point the run's recipe (data.source, data.cache_dir) at the data the run was "
        "trained on, or prepare that data again with the same settings.",
        false_positives="None known: the order is a pure function of the seed and position.",
    ),
)

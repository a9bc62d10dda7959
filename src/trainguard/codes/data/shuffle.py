"""Data codes D301-D399: shuffle quality."""

from trainguard.codes import Code, register

register(
    Code(
        code="D301",
        title="Poor shuffle: windows of the data order over-represent some sources",
        severity="warning",
        catches="Windows of consecutive samples whose mix of sources (files or datasets) departs "
        "from the global mix far more than random sampling allows: the summed chi-square over "
        "windows is significant (p < 1e-6) and its mean is at least twice its expectation. "
        "Files read in sequence and shards shuffled with a small buffer fail.",
        why="The model sees one source for many steps, then another: the loss oscillates with "
        "the source (a 'wavy' loss curve), the model forgets earlier sources, and learning-rate "
        "decay can end on an unrepresentative stretch of data.",
        fix="Use a global permutation of samples (trainguard's elastic Feistel order), or a "
        "shuffle buffer much larger than a shard, or interleave shards from all sources.",
        false_positives="Curricula that order data on purpose (by domain or difficulty) fail "
        "by design.",
        references=(
            "Pearson 1900, On the criterion that a given system of deviations from the "
            "probable ... (the chi-square goodness-of-fit test)",
            "TensorFlow tf.data.Dataset.shuffle documentation: a buffer smaller than the "
            "dataset gives only a partial shuffle",
        ),
    ),
    Code(
        code="D302",
        title="Shuffle quality not measurable",
        severity="info",
        catches="Fewer than two sources, or too few samples for two windows.",
        why="With one source there is no mix to measure; a skipped check is not a pass.",
        fix="Label samples by file or dataset of origin to measure mixing.",
    ),
)

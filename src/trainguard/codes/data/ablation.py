"""Data codes D430-D439: data ablations (`trainguard data ablate`)."""

from trainguard.codes import Code, register

register(
    Code(
        code="D430",
        title="A data variant makes the model worse",
        severity="warning",
        catches="`data ablate`: a filtered variant of the data whose small runs score worse "
        "than the base's on a use-case eval or on the shared held-out set, paired by seed, "
        "with a confidence interval on the mean difference that excludes zero.",
        why="The filter removes data the use case needs (a language, a domain, the kind of "
        "text the eval asks about): a model trained on it at full scale gets worse where it "
        "matters, while its own validation loss, measured on its own filtered data, may look "
        "better.",
        fix="Look at what the filter removes (`trainguard data inspect` on the removed "
        "documents) and loosen it, or keep the documents the eval depends on.",
        false_positives="An effect at the gating scale that reverses at full scale; an eval "
        "that measures something the use case does not need.",
        lifecycle="preview",
    ),
    Code(
        code="D431",
        title="A data variant makes the model better",
        severity="info",
        catches="`data ablate`: a variant whose runs score better than the base's on a metric, "
        "with a confidence interval on the paired mean difference that excludes zero.",
        why="Evidence for the filter: what it removes was hurting the use case at this scale.",
        fix="Nothing to fix; confirm at a larger scale before adopting a filter with a small "
        "effect.",
        lifecycle="preview",
    ),
    Code(
        code="D432",
        title="An ablation run left out of the comparison",
        severity="warning",
        catches="`data ablate`: a run with no use-case evals at its last step (it did not "
        "finish, or its metric log lost the row).",
        why="Its seed is missing from the pairs: the interval is wider, and a comparison with "
        "no pair left says nothing.",
        fix="Run the same command again: finished runs are kept, the others resume.",
        lifecycle="preview",
    ),
    Code(
        code="D433",
        title="An ablation with few seeds",
        severity="info",
        catches="`data ablate` compared a variant over fewer than 6 paired seeds.",
        why="With K seeds the exact sign-flip test cannot go below p = 2/2^K (0.25 with 3), "
        "and a t interval from 2 degrees of freedom is wide: only large effects show.",
        fix="Pass --seeds 6 or more when the effect you look for is small.",
        lifecycle="preview",
    ),
    Code(
        code="D434",
        title="No detectable difference at this scale",
        severity="info",
        catches="`data ablate`: a variant whose confidence intervals include zero on every "
        "use-case eval metric (the held-out sets are reported beside it).",
        why="The filter's effect, if any, is smaller than the seed-to-seed spread of runs at "
        "this scale: it is not shown to help or to hurt.",
        fix="Adopt or drop the filter on other grounds (cost, policy), or measure with more "
        "seeds, more steps or a larger model.",
        lifecycle="preview",
    ),
)

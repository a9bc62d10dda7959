"""Data codes D250-D259: train/eval contamination (`trainguard data contamination`)."""

from trainguard.codes import Code, register

register(
    Code(
        code="D250",
        title="Eval examples found in the training data (contamination)",
        severity="error",
        catches="Eval examples (the context with its gold choice, the prompt with its answer, "
        "the perplexity text) one of whose 13-grams of normalised words occurs in a training "
        "document (GPT-3's rule), or whose word 5-grams are contained, at or above the "
        "threshold (0.8), in one training document (a MinHash containment estimate: a short "
        "example inside a long document), or whose word 5-grams are in one training document "
        "at an exact share of 0.35 or more (`--edit-containment`: a lightly edited copy, e.g. "
        "a word in ten changed or a word inserted every twelve, which breaks every 13-gram). "
        "One finding per contaminated task, with the share "
        "of its examples affected; `data contamination --json` lists each example with the "
        "training document ids. In `trainguard run`'s pre-flight it is a warning unless a "
        "task's contaminated share is above `preflight.contamination_max`.",
        why="A model that trained on the test scores what it memorised, not what it can do: "
        "the eval overstates the model, and comparisons between checkpoints or runs measure "
        "the leak.",
        fix="Drop the contaminated examples from the eval (report scores on the clean subset "
        "too, as GPT-3 did), or remove the matching documents from the training data; then "
        "run `trainguard data contamination` again.",
        false_positives="Text every document of a kind shares (licence headers, boilerplate, "
        "common code idioms) makes 13-grams match without a real leak: look at the matched "
        "documents; the share of a task, not a single example, is what pre-flight acts on. "
        "An example that is mostly a fixed template (a short question inside long standard "
        "instructions) can reach the edited-copy share through the template alone: its match "
        "is `edit`; raise `--edit-containment` to check.",
        references=(
            "Brown et al. 2020, Language Models are Few-Shot Learners, appendix C "
            "(13-gram overlap)",
            "Broder 1997, On the resemblance and containment of documents (containment)",
            "Koslicki and Zabeti 2019, Improving MinHash via the containment index with "
            "applications to metagenomic analysis",
        ),
    ),
)

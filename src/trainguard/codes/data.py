"""Data layer codes (D): the corpus, its order, its duplicates and its quality.

D101-D199 corpus, shards and data order (D140-D149 the batch behind a step); D201-D209
deduplication; D210-D249 quality filters; D250-D259 train/eval contamination; D301-D399 shuffle
quality; D401-D429 chat (instruction-tuning) data.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

_MINHASH = "Broder, On the resemblance and containment of documents, 1997"
_FINEWEB = "Penedo et al., The FineWeb Datasets, 2024 (MinHash, 5-grams, 14 bands of 8 rows)"
_LEE = "Lee et al., Deduplicating Training Data Makes Language Models Better, ACL 2022"
_MMDS = "Leskovec, Rajaraman, Ullman, Mining of Massive Datasets, ch. 3 (LSH banding)"
_GOPHER = (
    "Rae et al. 2021, Scaling Language Models: Methods, Analysis & Insights from Training "
    "Gopher, appendix A.1.1 (arXiv:2112.11446)"
)
_CODE_FP = (
    "Source code, tables, lists and poetry are not prose: these web-text heuristics reject "
    "much of them. Disable the rule (`--disable CODE`) for such corpora."
)


# --- D1xx corpus, shards and data order -----------------------------------------------------------
register(
    Code(
        code="D101",
        title="Corpus documents skipped: not valid UTF-8",
        severity="warning",
        catches="Files (or JSONL lines, Parquet binary values) of the corpus that do not decode as "
        "UTF-8, or hold a lone surrogate (a JSON escape such as \\ud800); they are skipped and "
        "counted instead of stopping the run.",
        why="Skipped data is data the model never sees. A few odd files are harmless; many mean "
        "the corpus is in another encoding (Latin-1, UTF-16) or holds binaries, and the run "
        "trains on a fraction of what you think.",
        fix="Convert the files to UTF-8 (iconv -f latin1 -t utf-8) or remove binaries from the "
        "source folder; the count is in the manifest's `stats.skipped_non_utf8`.",
        false_positives="Folders that deliberately hold binary files next to the text.",
    ),
    Code(
        code="D102",
        title="Prepared data file corrupt: shard, index or tokenizer",
        severity="error",
        catches="A prepared shard, document index or tokenizer.json that is missing, truncated or "
        "whose xxh3 checksum differs from the manifest.",
        why="Memory-mapped shards are read without parsing: a flipped byte or a truncated file "
        "becomes wrong tokens or a shorter stream, and the run trains on garbage without any "
        "error.",
        fix="Move the prepared folder named in the message aside (mv DIR DIR.bad, kept as "
        "evidence) and run again; the data is re-prepared from the source. Check the disk if "
        "it happens twice.",
        references=("OLMo-core data loader: checksummed numpy token files",),
    ),
    Code(
        code="D103",
        title="Prepared data manifest corrupt or from another format",
        severity="error",
        catches="A manifest.json that is missing, not valid JSON (truncated), edited (its "
        "self-checksum does not match) or written by another format version.",
        why="The manifest is what every checksum is compared to; an edited manifest could bless "
        "damaged shards, a truncated one says nothing about them.",
        fix="Move the prepared folder named in the message aside (mv DIR DIR.bad) and run "
        "again; the data is re-prepared from the source. A folder `trainguard data prepare` did "
        "not write is not prepared data: give the folder it printed as `dir`.",
    ),
    Code(
        code="D104",
        title="Data changed between run start and resume",
        severity="error",
        catches="A resumed run whose prepared data (tokenizer hash, shard checksums or token "
        "counts) differs from the data the run was started with.",
        why="Sample ids index the packed stream: with a different stream (source edited, another "
        "tokenizer) the same ids are different text, so the resumed run silently replays, "
        "skips or mixes data, and its loss curve is not comparable.",
        fix="Resume with the original data (same source files, same tokenizer settings), or start "
        "a new run directory for the new data. `trainguard run` stops such a resume (exit 1); "
        "`--accept-data-change` continues on the new data on purpose.",
        false_positives="None: even an innocent edit changes which text each sample id means.",
    ),
    Code(
        code="D105",
        title="Corpus files skipped: links that lead out of the source folder",
        severity="warning",
        catches="Files of a source folder that are symbolic links to files outside the folder; "
        "they are not read (links to folders, FIFOs and devices are never read either).",
        why="A source folder is the data: a link that leads elsewhere (another user's files, "
        "/etc, a mount that changes) would pull unlisted, unreviewed files into the corpus, "
        "and the prepared data would change when the link's target does.",
        fix="Copy the linked files into the source folder (cp -L), or point data.source at the "
        "folder that holds them; the count is in the manifest's `stats.skipped_links`.",
        false_positives="Folders assembled from links on purpose (a Hugging Face cache "
        "snapshot links to its blobs): copy them with `cp -rL` first.",
    ),
    Code(
        code="D110",
        title="Data order diverged on resume: batch hash mismatch",
        severity="error",
        catches="A step whose batch (the hash of its global sample ids) differs from the batch "
        "recorded for the same step before the restart.",
        why="Resumption that replays, skips or reorders data (above all when the number of "
        "processes changes) biases training and makes runs irreproducible, and nothing else "
        "notices: the loss still goes down.",
        fix="Resume from the checkpoint's loader state with the same seed and data; the elastic "
        "order maps (seed, epoch, position) to samples independently of the world size. Look for "
        "code that re-seeds or re-shuffles per process.",
        references=("Feistel-network permutations (Luby & Rackoff 1988)",),
    ),
)

# --- D140-D149 the batch behind a step (`trainguard batch RUN_DIR --step N`) ----------------------
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

# --- D201-D209 deduplication ----------------------------------------------------------------------
register(
    Code(
        code="D201",
        title="Duplicates removed (summary)",
        severity="info",
        catches="How many documents `data dedup` removed as exact duplicates (same text after "
        "NFC, case folding and whitespace collapsing) and as near duplicates (Jaccard "
        "similarity at or above the threshold: the MinHash estimate decides far from it, the "
        "exact similarity of the shingle sets within 4 standard deviations of it).",
        why="Duplicated documents waste compute, are memorised more, and skew evaluation when "
        "they overlap the test set.",
        fix="Nothing to do; the clusters file says which document was removed in favour of "
        "which, with the estimated similarity.",
        false_positives="A pair more than 4 standard deviations of the estimate "
        "(sqrt(s(1-s)/112)) above the threshold is merged without the exact check: about one "
        "pair in a million just below the threshold gets that far.",
        references=(_LEE, _FINEWEB),
    ),
    Code(
        code="D202",
        title="Large share of the corpus is duplicated",
        severity="warning",
        catches="More than 30% of the input documents were removed as duplicates.",
        why="A share that high usually means the pipeline ingested the same source twice, or a "
        "crawl is full of templates; the remaining data may be much smaller than planned, so "
        "token budgets and epoch counts are off.",
        fix="Check the sources for repeated ingestion, and re-plan the token budget on the kept "
        "count.",
        false_positives="Raw web crawls are often more than 30% duplicated; that is expected "
        "before deduplication.",
        references=(_LEE,),
    ),
    Code(
        code="D203",
        title="Many documents shorter than one shingle",
        severity="warning",
        catches="More than 10% of the documents have fewer words than the shingle size (5).",
        why="Such a document is a single shingle, so MinHash can only match it to a copy that is "
        "identical after normalisation: near-duplicate detection is blind for them.",
        fix="Filter very short documents first (`trainguard data filter`), or deduplicate them "
        "by another key; lower --ngram only if short texts are the real data.",
        false_positives="Corpora of short texts by design (titles, queries).",
        references=(_FINEWEB,),
    ),
    Code(
        code="D204",
        title="One giant duplicate cluster",
        severity="warning",
        catches="One cluster holds more than 1% of the input (and at least 10 documents).",
        why="Union-find joins chains of pairwise-similar documents, so templated pages (cookie "
        "banners, boilerplate) can merge many documents whose content differs; all but one are "
        "removed.",
        fix="Look at the cluster in the clusters file; strip the boilerplate before "
        "deduplicating, or raise --threshold.",
        false_positives="A corpus that truly holds many copies of one document.",
        references=(_MMDS,),
    ),
    Code(
        code="D205",
        title="Empty documents",
        severity="warning",
        catches="Documents whose text is empty or only whitespace.",
        why="They carry no training signal but still take an end-of-text token and a place in "
        "the order; they are all exact duplicates of each other, so all but the first are removed.",
        fix="Drop empty documents upstream (they usually mean a failed extraction).",
        references=(_MINHASH,),
    ),
)

# --- D210-D249 quality filters (`trainguard.filters`) ---------------------------------------------
register(
    Code(
        code="D210",
        title="Document too short",
        severity="warning",
        catches="A document with fewer words than the lower bound (Gopher: 50 words).",
        why="Very short documents are mostly boilerplate (menus, cookie notices, titles) and "
        "carry little context to learn from.",
        fix="Drop the document, or lower the bound (`--min-words`) if short texts are intended.",
        false_positives="Short but genuine texts (tweets, headlines, one-line code files).",
        references=(_GOPHER,),
    ),
    Code(
        code="D211",
        title="Document too long",
        severity="warning",
        catches="A document with more words than the upper bound (Gopher: 100,000 words).",
        why="Extremely long documents are usually concatenated dumps, logs or tables that "
        "dominate the token budget with one style.",
        fix="Drop or split the document, or raise the bound (`--max-words`).",
        false_positives="Books and long reports in book corpora.",
        references=(_GOPHER,),
    ),
    Code(
        code="D212",
        title="Mean word length out of range",
        severity="warning",
        catches="A document whose mean word length is outside 3 to 10 characters (Gopher).",
        why="Mean word length far from natural language signals hashes, base64, URLs lists or "
        "run-together text without spaces.",
        fix="Drop the document; check the extraction step that produced it.",
        false_positives=_CODE_FP,
        references=(_GOPHER,),
    ),
    Code(
        code="D213",
        title="Symbol-to-word ratio too high",
        severity="warning",
        catches="More than 0.1 hash symbols or ellipses ('#', '...', '…') per word (Gopher).",
        why="Hashtag lists and truncated snippets ('Read more...') are spam and teaser text.",
        fix="Drop the document.",
        false_positives=_CODE_FP + " Python and shell comments use '#'.",
        references=(_GOPHER,),
    ),
    Code(
        code="D214",
        title="Too few alphabetic words",
        severity="warning",
        catches="Fewer than 80% of the words contain an alphabetic character (Gopher).",
        why="Documents of numbers, symbols or markup teach the model little language.",
        fix="Drop the document.",
        false_positives=_CODE_FP + " Numeric tables are rejected by design.",
        references=(_GOPHER,),
    ),
    Code(
        code="D215",
        title="Too many bullet or ellipsis lines",
        severity="warning",
        catches="More than 90% of lines start with a bullet, or more than 30% of lines end with "
        "an ellipsis (Gopher).",
        why="Such pages are navigation menus, link lists or truncated previews.",
        fix="Drop the document.",
        false_positives="Genuine lists (checklists, recipes' ingredient lists).",
        references=(_GOPHER,),
    ),
    Code(
        code="D220",
        title="Repeated lines",
        severity="warning",
        catches="Duplicate lines make up more than 30% of the lines, or more than 20% of the "
        "characters in lines (Gopher repetition removal).",
        why="Repeated lines are boilerplate or spam; the model memorises them and wastes "
        "compute; repetitive training text raises the rate of degenerate repetition loops.",
        fix="Drop the document.",
        false_positives="Song lyrics with refrains, code with repeated statements, data tables.",
        references=(_GOPHER,),
    ),
    Code(
        code="D221",
        title="Repeated paragraphs",
        severity="warning",
        catches="Duplicate paragraphs (blocks separated by blank lines) make up more than 30% of "
        "the paragraphs, or more than 20% of the characters in paragraphs (Gopher).",
        why="As for repeated lines: boilerplate blocks repeated within a page.",
        fix="Drop the document.",
        false_positives="Templated but genuine documents (legal forms).",
        references=(_GOPHER,),
    ),
    Code(
        code="D222",
        title="Dominant n-gram",
        severity="warning",
        catches="The most frequent word 2-, 3- or 4-gram covers more than 20%, 18% or 16% of the "
        "characters of all words (Gopher top n-gram character fraction).",
        why="One phrase repeated throughout a document is keyword stuffing or a generation "
        "loop captured in the data.",
        fix="Drop the document.",
        false_positives="Very short documents, where any repeated pair is a large fraction.",
        references=(_GOPHER,),
    ),
    Code(
        code="D223",
        title="Duplicated n-grams",
        severity="warning",
        catches="Word 5- to 10-grams that occur more than once cover more than 15% (n=5) down "
        "to 10% (n=10) of the characters (Gopher duplicate n-gram character fraction).",
        why="Long repeated passages inside one document are copy-paste boilerplate or "
        "degenerate generated text.",
        fix="Drop the document.",
        false_positives="Code and structured text that repeat long identifiers or clauses.",
        references=(_GOPHER,),
    ),
    Code(
        code="D230",
        title="Invalid UTF-8",
        severity="warning",
        catches="Bytes that are not valid UTF-8 (kept as surrogate escapes when read) or lone "
        "surrogate code points in the text.",
        why="Invalid bytes become replacement characters or crash later stages; they signal a "
        "wrong source encoding (Latin-1, Windows-1252) or truncated multi-byte characters.",
        fix="Decode the source with its real encoding (or repair it, e.g. with ftfy) before "
        "training; otherwise drop the document.",
        references=("The Unicode Standard, section 3.9 (UTF-8 well-formedness)",),
    ),
    Code(
        code="D231",
        title="Replacement characters",
        severity="warning",
        catches="U+FFFD REPLACEMENT CHARACTER in the text: an earlier lossy decode destroyed "
        "the original characters.",
        why="The lost characters cannot be recovered; the model learns to emit U+FFFD.",
        fix="Re-extract the text from the original bytes with the right encoding, or drop it.",
        false_positives="Documents about Unicode itself.",
    ),
    Code(
        code="D232",
        title="Control characters",
        severity="warning",
        catches="C0/C1 control characters other than tab, newline and carriage return, and "
        "invisible format characters (zero-width spaces, BOM inside text, bidi overrides).",
        why="They are extraction debris (form feeds, NULs, escape sequences) or invisible "
        "characters that change how text is tokenized without changing how it looks.",
        fix="Strip them in preprocessing, or drop the document.",
        false_positives="Form feeds in old source files and texts that use zero-width joiners in "
        "scripts that need them (emoji sequences, some Indic and Arabic text).",
        references=("Unicode Technical Report #36, Unicode Security Considerations",),
    ),
    Code(
        code="D240",
        title="Dangling table or figure reference",
        severity="warning",
        catches="A mention such as 'see Table 2', 'Table IV', 'table one' or 'see figure three' "
        "where the document holds no such table or figure: no caption line ('Table 2:', in "
        "any notation of the number) and, for tables, no table block (markdown pipes or ASCII "
        "rules); for figures, no image.",
        why="Preprocessing stripped the table or figure but kept the prose that refers to it; "
        "the model learns to cite content that is not there.",
        fix="Keep tables and captions during extraction (or render them as text), or drop the "
        "document.",
        false_positives="References to tables and figures of other documents ('Table 2 of "
        "[12]'), and captions in a format the rule does not recognise. 'table' and 'figure' "
        "used as verbs before a spelled-out number count only when the number ends the phrase "
        "('we figure two.'); 'figure two things out' passes.",
    ),
)

# --- D250-D259 train/eval contamination (`trainguard data contamination`) -------------------------
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

# --- D3xx shuffle quality -------------------------------------------------------------------------
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

# --- D401-D429 chat data (`trainguard data check-chat`, `check_chat_dataset`) ---------------------
_TEMPLATES = "Hugging Face, Chat templates (transformers documentation: apply_chat_template)"
_GEN = (
    "Hugging Face, Chat templates: training with `{% generation %}` and "
    "return_assistant_tokens_mask"
)
_EXAMPLES = (
    "data.example_ids lists the examples (0-based line numbers; the first 50, data.count says "
    "how many); data.examples describes the first five."
)
register(
    Code(
        code="D401",
        title="Training rendering differs from the tokenizer's chat template",
        severity="error",
        catches="Examples whose training token ids (the input_ids or text column, or the "
        "--template file applied to the messages) differ from the tokenizer's chat_template "
        "applied to the same messages: the first differing token, both sides decoded. " + _EXAMPLES,
        why="Serving applies the tokenizer's chat template. A model fine-tuned on another "
        "rendering (other role headers, a missing newline, an extra BOS, other end-of-turn "
        "tokens) meets prompts at inference it never saw in training: it answers worse, runs "
        "on past the turn, or emits the training format's markers.",
        fix="Render the training data with the tokenizer's own chat template "
        "(tokenizer.apply_chat_template), or ship the training template as the tokenizer's "
        "chat_template.",
        false_positives="A template that renders earlier assistant turns differently from the "
        "last one (reasoning stripped from history) differs on multi-turn examples by design.",
        references=(_TEMPLATES,),
        lifecycle="preview",
    ),
    Code(
        code="D402",
        title="A chat-data check could not run",
        severity="info",
        catches="A chat check skipped: examples with no training rendering of their own and no "
        "--template (the rendering is the chat template's, nothing to compare), a tokenizer "
        "without a chat_template, or a Trainer's collator that cannot be called on the dataset.",
        why="A skipped check is not a pass.",
        fix="Give --template FILE (the template the training code renders with), or keep the "
        "training pipeline's text or input_ids in the data.",
        lifecycle="preview",
    ),
    Code(
        code="D403",
        title="Loss on the prompt: labels on system or user tokens",
        severity="error",
        catches="Examples whose labels (the labels column, a collator's, or the template's "
        "{% generation %} marks) cover tokens of a system, user or tool turn; rows without "
        "messages whose labels cover every token. " + _EXAMPLES,
        why="Supervised fine-tuning learns the responses. Training on the prompt spends "
        "capacity on imitating users, and on short answers the prompt's tokens dominate the "
        "loss: a plausible loss curve and a worse assistant.",
        fix="Mask the prompt: labels -100 outside the assistant turns (TRL: "
        "assistant_only_loss or completion_only_loss; a {% generation %} block around the "
        "assistant content in the template).",
        false_positives="Rows that are plain pre-training text (no prompt) labelled on every "
        "token.",
        references=(_GEN,),
        lifecycle="preview",
    ),
    Code(
        code="D404",
        title="The model never learns to stop: end-of-turn token unlabelled or absent",
        severity="error",
        catches="Assistant turns whose content is learned but whose end-of-turn token (the "
        "special token the template puts after the content: EOS, <|im_end|>, <|eot_id|>) has no "
        "label, and renderings where no end-of-turn token follows the last response. " + _EXAMPLES,
        why="A model that never sees the end-of-turn token as a target never predicts it: "
        "generation runs on past the answer into invented user turns until the length limit.",
        fix="Include the end-of-turn token in the assistant's labels (inside the "
        "{% generation %} block); append the EOS token after each response when rendering "
        "prompt/response pairs.",
        false_positives="Templates whose turn ends with an ordinary (non-special) token are not "
        "located, so not checked.",
        references=(_GEN,),
        lifecycle="preview",
    ),
    Code(
        code="D405",
        title="Responses cut at the training length",
        severity="warning",
        catches="Examples longer than --max-length (or whose input_ids stop short of the "
        "rendering) whose response runs past the cut: the share of the data and how many "
        "response tokens each loses. " + _EXAMPLES,
        why="A cut response is learned without its ending: the model learns answers that stop "
        "mid-sentence and never see the end-of-turn token.",
        fix="Raise max_length, drop or split the longest examples, or truncate the prompt "
        "(from the left) instead of the response.",
        lifecycle="preview",
    ),
    Code(
        code="D406",
        title="Examples left with no response to learn",
        severity="error",
        catches="Examples whose prompt alone fills --max-length (no response token before the "
        "cut), or whose labels are all -100. " + _EXAMPLES,
        why="They cost compute and teach nothing; a batch made only of them gives a loss of NaN "
        "(0/0) in many trainers, and their share of the data is silently lost.",
        fix="Filter these examples out, raise max_length, or truncate the prompt instead.",
        lifecycle="preview",
    ),
    Code(
        code="D407",
        title="Conversation roles out of order",
        severity="error",
        catches="Conversations that do not alternate user and assistant turns (tool turns after "
        "an assistant's call), that start with an assistant turn, hold a system message after "
        "the first position, or end without an assistant turn. " + _EXAMPLES,
        why="Templates render such conversations into sequences serving never produces (many "
        "templates raise on them); two user turns in a row train the model to answer a prompt "
        "it was never asked, and a conversation ending on a user turn has nothing to learn.",
        fix="Merge consecutive turns of one role, drop conversations without a response, and "
        "put the system message first.",
        lifecycle="preview",
    ),
    Code(
        code="D408",
        title="Empty turn",
        severity="warning",
        catches="Messages whose content is empty or only whitespace. " + _EXAMPLES,
        why="An empty assistant turn teaches the model to answer with nothing (an end-of-turn "
        "token at once); an empty user turn is a conversion bug upstream.",
        fix="Drop the examples, or fix the conversion that lost the content.",
        false_positives="An empty system message some pipelines add on purpose.",
        lifecycle="preview",
    ),
    Code(
        code="D409",
        title="System prompt duplicated",
        severity="warning",
        catches="Conversations with more than one system message, or whose system prompt "
        "(16 characters or more) is repeated inside another message. " + _EXAMPLES,
        why="The model learns a prompt layout serving never sends (the system prompt twice), "
        "and the repeated text takes context length from the conversation.",
        fix="Keep one system message, first; do not also prepend it to the user's turn.",
        lifecycle="preview",
    ),
    Code(
        code="D410",
        title="Doubled BOS or EOS token",
        severity="error",
        catches="Training token ids with BOS or EOS twice in a row: typically a template that "
        "writes the BOS token and a tokenizer that adds another when the text is tokenized "
        "with special tokens, or an EOS appended after a template's own. " + _EXAMPLES,
        why="Serving produces one BOS: every training example starts in a state the model never "
        "meets at inference, and a doubled EOS teaches it to emit EOS after EOS.",
        fix="Tokenize rendered chat text with add_special_tokens=False (the template already "
        "holds the special tokens), and append EOS only when the template does not.",
        lifecycle="preview",
    ),
    Code(
        code="D411",
        title="Unknown role",
        severity="error",
        catches="Messages whose role is none of system, user, assistant, tool (ShareGPT's "
        "human/gpt, 'bot', a typo). " + _EXAMPLES,
        why="Templates render unknown roles as they are (a header serving never produces) or "
        "raise; the turn's loss masking is then undefined.",
        fix="Map the roles to system, user, assistant and tool before training.",
        false_positives="A template made for other role names (then map them, or extend it).",
        lifecycle="preview",
    ),
    Code(
        code="D412",
        title="Packed examples attend across their boundaries",
        severity="error",
        catches="Rows that pack several examples into one sequence (a packed flag, seq_lengths, "
        "segment ids, BOS starting a document again, a collator seen packing) with neither a "
        "document mask (segment ids, cu_seqlens, a 2-D mask) nor position ids reset to 0 at "
        "each document start. " + _EXAMPLES,
        why="Each example attends to the unrelated ones before it and sees positions it never "
        "sees at inference: the model learns to condition on noise, and the effective context "
        "of short examples is polluted.",
        fix="Pack with a document mask (flash-attention varlen through position ids or "
        "cu_seqlens: DataCollatorWithFlattening, TRL padding_free) or reset position_ids at "
        "each example; or do not pack.",
        false_positives="A rendering that uses BOS inside a conversation (rare).",
        references=(
            "Krell et al. 2021, Efficient Sequence Packing without Cross-contamination "
            "(arXiv:2107.02027)",
        ),
        lifecycle="preview",
    ),
    Code(
        code="D413",
        title="Packed examples masked, but positions run on",
        severity="warning",
        catches="Packed rows whose document mask separates the examples but whose position ids "
        "continue across them (no reset at a document start). " + _EXAMPLES,
        why="Later examples in a row train at positions they never occupy at inference (a "
        "response at position 1500 instead of 40), a train/serve mismatch for rotary and "
        "learned position embeddings.",
        fix="Reset position_ids to 0 at each example's first token.",
        lifecycle="preview",
    ),
    Code(
        code="D414",
        title="A chat template refuses the example",
        severity="error",
        catches="Examples for which the tokenizer's chat template (or the --template file) "
        "raises (its raise_exception, an undefined value), with the template's message. "
        + _EXAMPLES,
        why="Serving cannot render such a conversation, or the training pipeline drops or "
        "crashes on it.",
        fix="Fix the examples the message names (roles, alternation, missing fields), or the "
        "template.",
        lifecycle="preview",
    ),
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

"""Data codes D210-D249: quality filters (`trainguard.filters`)."""

from trainguard.codes import Code, register

_GOPHER = (
    "Rae et al. 2021, Scaling Language Models: Methods, Analysis & Insights from Training "
    "Gopher, appendix A.1.1 (arXiv:2112.11446)"
)
_CODE_FP = (
    "Source code, tables, lists and poetry are not prose: these web-text heuristics reject "
    "much of them. Disable the rule (`--disable CODE`) for such corpora."
)


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

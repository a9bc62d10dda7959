"""Quality filter rules: each planted defect raises exactly its code; clean documents nothing."""

from __future__ import annotations

import pytest

from trainguard.filters import ALL_CODES, FilterConfig, apply_rules, reasons, select_rules

CLEAN = """The river town woke slowly under a grey autumn sky. Fishermen dragged their boats
across the pebbles while the baker opened his shutters and set warm loaves on the sill.
Children ran past the church towards the school, arguing about a football match they had
watched on Saturday evening. Nobody noticed the stranger who stepped off the early train,
carrying a leather suitcase and a folded map. She asked the station master for directions
to the old lighthouse, thanked him politely, and walked along the harbour wall without
looking back. Later that morning, rumours about her spread through every shop and kitchen."""

# Captioned table and figure, referenced in the prose; plus phrases that look like mentions.
CLEAN_WITH_TABLE = """We compare three training schedules on the same corpus. Table 1 lists the
final validation loss of each schedule, and Figure 2 plots the loss against the number of
tokens seen. The cosine schedule wins by a small but consistent margin in every run we made,
and we describe the table I built from the logs below so that readers can figure it out.

| schedule | loss |
|---|---|
| constant | 3.21 |
| cosine | 3.05 |

Table 1: Final validation loss per schedule.

![loss curves](figure2.png)

Figure 2. Validation loss against tokens for the three schedules, averaged over seeds.
"""


def codes(text: str, cfg: FilterConfig | None = None) -> set[str]:
    return {f.code for f in apply_rules(text, cfg)}


@pytest.mark.parametrize("text", [CLEAN, CLEAN_WITH_TABLE])
def test_clean_documents_raise_nothing(text):
    assert apply_rules(text) == []


def test_clean_documents_pass_at_every_length_bound():
    # Make sure the bounds are inclusive where Gopher's are and the docs are not borderline.
    n = len(CLEAN.split())
    assert codes(CLEAN, FilterConfig(min_words=n, max_words=n)) == set()


def _numbers(k: int) -> str:
    return " ".join(str(1000 + 7 * i) for i in range(k))


PLANTED = {
    "D210": "Too short a text to learn from.",
    "D212": " ".join(f"internationalisation{chr(97 + i % 26)}{i}" for i in range(60)),
    "D213": CLEAN + "\n" + " ".join(f"#topic{chr(97 + i)}" for i in range(15)),
    "D214": CLEAN + "\n" + _numbers(40),
    "D215": "\n".join(
        [
            "- apples picked this morning from the northern orchard",
            "- pears wrapped in tissue paper for gentle storage",
            "- plums sold by weight at the Saturday market stall",
            "- grapes grown on sunny terraces above the valley",
            "- cherries that stain your fingers a deep crimson",
            "- lemons shipped overnight across the mountains by truck",
            "- melons chilled in cold spring water until noon",
            "- figs dried slowly under muslin on wooden racks",
        ]
    ),
    "D220": CLEAN.replace("\n", "\nShare\n", 6),
    "D221": "Read more below.\n\n" + CLEAN + "\n\nRead more below.",
    "D222": CLEAN + " " + " ".join(f"best price {w}" for w in "abcdefghijklmnop"),
    "D223": CLEAN + " " + " ".join(["click here to claim your free holiday voucher now"] * 4),
    "D230": CLEAN + " caf\udce9 au lait",
    "D231": CLEAN + " caf\ufffd au lait",
    "D232": CLEAN + " bell\x07 and override \u202e here",
    "D240": CLEAN + " The results are summarised in Table 3 and Fig. 4.",
}


@pytest.mark.parametrize("code", sorted(PLANTED))
def test_planted_defect_raises_exactly_its_code(code):
    assert codes(PLANTED[code]) == {code}


def test_too_long_document():
    assert codes(CLEAN, FilterConfig(max_words=40)) == {"D211"}


def test_spans_point_at_the_defect():
    text = PLANTED["D240"]
    spans = [text[f.start : f.end] for f in apply_rules(text)]
    assert spans == ["Table 3", "Fig. 4"]
    text = PLANTED["D232"]
    assert [text[f.start : f.end] for f in apply_rules(text)] == ["\x07", "\u202e"]
    text = PLANTED["D230"]
    assert [text[f.start : f.end] for f in apply_rules(text)] == ["\udce9"]


def test_references_to_other_documents_and_uncaptioned_tables():
    base = CLEAN + " As in Table 2 of [12], and Figure 5 in Smith et al., the trend holds."
    assert codes(base) == set()
    # An uncaptioned markdown table covers a table mention; a caption for another number
    # does not cover a mention of table 3.
    table = "\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert codes(CLEAN + " See Table 3." + table) == set()
    assert codes(CLEAN + " See Table 3." + table + "\nTable 1: something.\n") == {"D240"}


def test_disable_by_code_or_name():
    text = PLANTED["D213"]
    assert apply_rules(text, rules=select_rules(["D213"])) == []
    assert apply_rules(text, rules=select_rules(["symbol_ratio"])) == []
    with pytest.raises(ValueError, match="unknown filter rule"):
        select_rules(["D999"])


def test_every_code_is_registered_with_docs():
    from trainguard.codes import get_code

    for code in ALL_CODES:
        entry = get_code(code)
        assert entry.catches and entry.why and entry.fix and entry.false_positives


def test_reasons_one_per_code():
    flags = apply_rules(PLANTED["D240"])
    assert len(flags) == 2
    assert [r["code"] for r in reasons(flags)] == ["D240"]


@pytest.mark.parametrize(
    "mention, span",
    [
        (" The totals are in table one.", "table one"),
        (" For the split, see figure three.", "figure three"),
        (" As Table Two shows, the cosine schedule wins.", "Table Two"),
        (" In figure four, we plot the loss.", "figure four"),
        (" The loss (Figure Eleven) keeps falling.", "Figure Eleven"),
        (" See Table IV for the totals.", "Table IV"),
    ],
)
def test_spelled_out_and_roman_numbers_are_dangling_references(mention, span):
    text = CLEAN + mention
    flags = [f for f in apply_rules(text) if f.code == "D240"]
    assert [text[f.start : f.end] for f in flags] == [span]


@pytest.mark.parametrize(
    "prose",
    [
        " She laid one table for the guests and admired the figure on the mantelpiece.",
        " The figure in the doorway was gone, and the table was set for one.",
        " At the meeting they voted to table one motion and figure two things out later.",
        " A table of ten and a figure of speech are different things.",
    ],
)
def test_prose_with_tables_and_figures_but_no_reference_passes(prose):
    assert codes(CLEAN + prose) == set()


def test_spelled_out_mention_is_covered_by_its_caption_in_any_notation():
    # The same table written three ways: digits in the caption, words and roman in the prose.
    caption = "\n\nTable 4: totals per schedule.\n\nFigure Three. The loss curves.\n"
    text = CLEAN + " See table four and Table IV; figure three shows the loss." + caption
    assert codes(text) == set()
    # A caption for a different number does not cover the mention.
    assert codes(CLEAN + " See table five." + caption) == {"D240"}

"""Dedup, local engine: planted exact, normalised and near duplicates; dissimilar pairs survive."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainguard.dedup import io
from trainguard.dedup.local import dedup_file
from trainguard.dedup.lsh import DedupParams, UnionFind, band_keys, bucket_links, s_curve
from trainguard.dedup.minhash import MinHasher, estimate, shingle_hashes
from trainguard.dedup.normalise import exact_key, normalise
from trainguard.dedup.planted import Generator, jaccard, planted_corpus
from trainguard.errors import BadInputError, DataError, OutputWriteError, exit_status_for


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def warning_codes(report) -> set[str]:
    return {f.code for f in report.findings if f.severity != "info"}


@pytest.fixture(scope="module")
def planted():
    return planted_corpus(n_background=200, seed=0)


def test_normalise_equates_case_whitespace_and_nfc():
    composed = "Caf\u00e9 au lait"
    decomposed = unicodedata.normalize("NFD", composed)
    assert composed != decomposed
    assert normalise(decomposed) == normalise(composed) == "caf\u00e9 au lait"
    assert normalise("  A\tB\n\nc  ") == "a b c"
    assert normalise("STRASSE") == normalise("stra\u00dfe")  # case folding, not lower()
    assert exact_key(normalise("a b")) != exact_key(normalise("a c"))


def test_minhash_estimates_planted_similarity_without_bias():
    g = Generator(seed=1)
    a = g.doc()
    b = g.near(a, 0.9)
    true = jaccard(a, b)
    assert abs(true - 0.9) < 0.01
    ests = []
    for seed in range(40):
        s = MinHasher(112, seed=seed).signatures([normalise(a), normalise(b)])
        ests.append(estimate(s[0], s[1]))
    sd = np.sqrt(true * (1 - true) / 112 / 40)  # standard error of the mean of 40 estimates
    assert abs(np.mean(ests) - true) < 4 * sd


def test_batch_signatures_equal_one_at_a_time_across_blocks():
    g = Generator(seed=2)
    texts = [normalise(g.doc(words=w)) for w in (3, 900, 5, 4200, 40, 1)] + [""]
    h = MinHasher(112, seed=7)
    batch = h.signatures(texts)
    single = np.stack([h.signatures([t])[0] for t in texts])
    assert np.array_equal(batch, single)
    assert (batch[-1] == 0xFFFFFFFF).all()  # no shingles
    assert len(shingle_hashes(texts[0])) == 1  # shorter than 5 words: one shingle
    assert np.array_equal(MinHasher(112, seed=7).signatures(texts), batch)  # deterministic


def test_s_curve_of_fineweb_setting():
    assert s_curve(0.8, 14, 8) == pytest.approx(0.924, abs=1e-3)
    assert s_curve(0.3, 14, 8) < 1e-3
    assert s_curve(0.95, 14, 8) > 0.9999
    assert np.all(np.diff(s_curve(np.linspace(0, 1, 50), 14, 8)) >= 0)


def test_union_find_roots_are_smallest_index():
    roots = UnionFind().roots([(9, 4), (4, 7), (12, 9), (3, 2)])
    assert roots == {9: 4, 7: 4, 12: 4, 3: 2}


def test_bucket_links_to_earliest_verified_member():
    params = DedupParams(threshold=0.8, bands=2, rows=56)  # 112 positions, sure at >= 106
    assert (params.reject_equal, params.accept_equal) == (73, 107)
    base = np.zeros(112, dtype=np.uint32)
    sigs = np.stack([base, base + 1, base + 1, base, base])
    sigs[2, :5] = 2  # 107 of 112 positions agree with member 5: sure
    sigs[4, :20] = 9  # 92 agree with member 2: near the threshold, for the exact check
    edges, unsure = bucket_links(np.array([2, 5, 8, 9, 11]), sigs, params)
    assert edges == [(8, 5), (9, 2)]  # 5 matches nothing earlier
    assert unsure == [(11, 2), (11, 9)]  # no sure match: every near pair is checked exactly


def test_planted_duplicates_removed_and_dissimilar_kept(tmp_path, planted):
    src = write_jsonl(tmp_path / "in.jsonl", planted.records)
    report = dedup_file(src, tmp_path / "out.jsonl")
    removed = {r.removed for r in report.rows}
    assert removed == planted.must_remove(0.85)  # exact, normalised, 0.95 and 0.9
    assert not removed & planted.must_keep(0.55)  # 0.5 and 0.3 pairs survive
    by_removed = {r.removed: r for r in report.rows}
    for later, earlier, sim, kind in planted.pairs:
        if sim < 0.85:
            continue
        row = by_removed[later]
        assert row.kept == earlier
        assert row.kind == ("near" if kind == "near" else "exact")
        assert row.similarity == pytest.approx(sim, abs=0.12)
        assert (row.removed_id, row.kept_id) == (
            planted.records[later]["id"],
            planted.records[earlier]["id"],
        )
    c = report.counts
    assert (c.input, c.exact_duplicates, c.near_duplicates) == (len(planted.records), 10, 6)
    assert c.kept == c.input - 16
    assert warning_codes(report) == set()  # a clean corpus gets no warnings
    assert [f.code for f in report.findings] == ["D201"]


def _datasketch_removed(texts: list[str], params: DedupParams) -> set[int]:
    """datasketch's usual dedup loop with the same normalisation, shingles, bands and rows."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(params.threshold, params.num_perm, params=(params.bands, params.rows))
    perms = MinHash(num_perm=params.num_perm, seed=params.seed).permutations
    removed = set()
    for i, text in enumerate(texts):
        words = normalise(text).split(" ")
        m = MinHash(params.num_perm, params.seed, permutations=perms, scheme="affine32")
        m.update_batch([" ".join(words[j : j + 5]).encode() for j in range(len(words) - 4)])
        if lsh.query(m):
            removed.add(i)
        else:
            lsh.insert(i, m)
    return removed


def test_recall_at_085_reaches_datasketch_without_false_merges(tmp_path):
    pytest.importorskip("datasketch")
    params = DedupParams()
    missed = {"trainguard": 0, "datasketch": 0}
    false_merges = 0
    lost_candidates = []
    for seed in range(3):
        p = planted_corpus(
            n_background=300,
            similarities=(0.95, 0.9, 0.86, 0.5, 0.3),
            copies_each=50,
            exact=0,
            normalised=0,
            seed=seed,
        )
        texts = [r["text"] for r in p.records]
        src = write_jsonl(tmp_path / f"in{seed}.jsonl", p.records)
        removed = {r.removed for r in dedup_file(src, tmp_path / f"out{seed}.jsonl").rows}
        dup = p.must_remove(0.85)
        missed["trainguard"] += len(dup - removed)
        missed["datasketch"] += len(dup - _datasketch_removed(texts, params))
        false_merges += len(removed & p.must_keep(0.55))
        # Verification loses no LSH candidate at or above the threshold: every pair whose bands
        # met is merged, whatever its signature estimate.
        sigs = MinHasher(params.num_perm, params.seed).signatures([normalise(t) for t in texts])
        keys = band_keys(sigs, params.bands, params.rows)
        for later, earlier, sim, _ in p.pairs:
            candidate = (keys[later] == keys[earlier]).any()
            if sim >= params.threshold and candidate and later not in removed:
                lost_candidates.append((seed, later, sim))
    assert lost_candidates == []
    assert missed["trainguard"] <= missed["datasketch"], missed
    assert false_merges == 0  # the 0.3 and 0.5 pairs all survive


def test_output_keeps_all_fields_in_input_order_and_bytes(tmp_path, planted):
    src = write_jsonl(tmp_path / "in.jsonl", planted.records)
    report = dedup_file(src, tmp_path / "out.jsonl")
    removed = {r.removed for r in report.rows}
    expected = [r for i, r in enumerate(planted.records) if i not in removed]
    assert io.read_records(tmp_path / "out.jsonl") == expected
    in_lines = src.read_bytes().splitlines()
    assert (tmp_path / "out.jsonl").read_bytes().splitlines() == [
        line for i, line in enumerate(in_lines) if i not in removed
    ]
    clusters = [json.loads(x) for x in Path(report.clusters_path).read_text().splitlines()]
    assert Path(report.clusters_path) == tmp_path / "out.clusters.jsonl"
    assert clusters == [r.to_dict() for r in report.rows]
    assert set(clusters[0]) == {"removed", "kept", "kind", "similarity", "removed_id", "kept_id"}


def test_parquet_in_parquet_out_keeps_schema(tmp_path):
    g = Generator(seed=5)
    recs = [{"id": i, "text": g.doc(), "score": i / 3, "tags": ["x"] * (i % 3)} for i in range(80)]
    recs.append(dict(recs[3], id=99, text=recs[3]["text"].upper()))
    table = pa.Table.from_pylist(recs)
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=16)
    report = dedup_file(tmp_path / "in.parquet", tmp_path / "out.parquet")
    assert [(r.removed, r.kept, r.kind) for r in report.rows] == [(80, 3, "exact")]
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.schema == table.schema
    assert out.to_pylist() == recs[:80]


def test_copy_of_a_near_duplicate_points_at_the_kept_document(tmp_path):
    g = Generator(seed=3)
    a = g.doc()
    b = g.near(a, 0.95)
    recs = [{"text": a}, {"text": g.doc()}, {"text": b}, {"text": b.upper()}]
    report = dedup_file(write_jsonl(tmp_path / "in.jsonl", recs), tmp_path / "o.jsonl")
    rows = [(r.removed, r.kept, r.kind) for r in report.rows]
    assert rows == [(2, 0, "near"), (3, 0, "near")]
    assert report.rows[0].similarity == report.rows[1].similarity < 1.0
    assert report.rows[0].removed_id is None  # no id field in the records


def test_warnings_each_fire_alone(tmp_path):
    g = Generator(seed=4)
    base = [{"text": g.doc()} for _ in range(20)]
    cases = {
        "D202": base + [dict(base[i]) for i in range(12)],
        "D203": base + [{"text": f"short doc {i}"} for i in range(5)],
        "D204": [{"text": g.doc()} for _ in range(1000)] + [dict(base[0])] * 12,
        "D205": base + [{"text": "   "}],
    }
    for code, recs in cases.items():
        report = dedup_file(write_jsonl(tmp_path / f"{code}.jsonl", recs), tmp_path / "o.jsonl")
        assert warning_codes(report) == {code}, code


def test_bad_input_is_rejected_with_a_fix(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "a b c"}])
    with pytest.raises(DataError, match="does not exist"):
        dedup_file(tmp_path / "missing.jsonl", tmp_path / "o.jsonl")
    (tmp_path / "in.csv").write_text("text\nx\n")
    with pytest.raises(BadInputError, match="neither JSON Lines nor Parquet"):
        dedup_file(tmp_path / "in.csv", tmp_path / "o.jsonl")
    for t in (0.0, 1.5, -0.2):
        with pytest.raises(BadInputError, match="out of range"):
            dedup_file(src, tmp_path / "o.jsonl", params=DedupParams(threshold=t))
    with pytest.raises(BadInputError, match="names parquet"):
        dedup_file(src, tmp_path / "o.parquet")
    (tmp_path / "folder.jsonl").mkdir()  # a folder where the file goes: a write failure (exit 1)
    with pytest.raises(OutputWriteError, match="folder.jsonl: Is a directory") as e:
        dedup_file(src, tmp_path / "folder.jsonl")
    assert exit_status_for(e.value) == 1 and "folder is in the way" in e.value.fix
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:3 has no string field 'text'") as e:
        dedup_file(bad, tmp_path / "o.jsonl")
    assert "--text-field" in e.value.fix


def test_spark_engine_without_pyspark_names_the_extra(monkeypatch, tmp_path):
    import sys

    from trainguard.util.spark import get_spark

    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # import now fails as if absent
    with pytest.raises(BadInputError, match="needs PySpark") as e:
        get_spark("local[1]")
    assert "trainguard[spark]" in e.value.fix

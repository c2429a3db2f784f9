"""The Debian-docs corpus builder on tiny synthetic inputs: no network, no apt."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from data_prep import docs_corpus as dc
from data_prep.errors import DataPrepError
from data_prep.sources.files import iter_file_documents

HTML = """<html><head><title>Ignored title</title></head><body>
<div class="navheader"><table><tr><td>Prev</td><td>Next</td></tr></table></div>
<h2>2.6. Joins</h2><p>
    Queries can access   multiple
    tables at once &amp; are called <em>join</em> queries.</p>
<pre class="programlisting">SELECT * FROM weather;</pre>
<table><tr><td>cell</td></tr></table>
<ul><li>first item</li><li>second item</li></ul>
<div class="navfooter"><div>Home</div></div></body></html>"""

RST = """.. _tut-classes:

*******
Classes
*******

Classes bundle data. See :func:`abs` and :ref:`the tutorial <tut-intro>`,
or ``len`` and `Python <https://python.org>`_.  For example::

    class Foo:
        pass

.. code-block:: c

   int main(void);

.. note::

   Notes are prose and stay.

.. this is a comment
   spanning two lines

>>> print(1)
1

+-----+-----+
| a   | b   |
+-----+-----+

The end."""

POD = """=head1 NAME

perlfoo - a C<foo> manual

=head2 Usage

Call C<< $a < $b >> or I<bar>, see L<the docs|perlfunc/open> and E<lt>tagE<gt>.X<index>

    my $code = 1;   # verbatim, dropped

=begin html

<p>dropped</p>

=end html

=over 4

=item * an item

=back

=cut
"""


def test_clean_html_keeps_prose_drops_navigation_code_and_tables() -> None:
    text = dc.clean_html(HTML)
    assert text == (
        "2.6. Joins\n\nQueries can access multiple tables at once & are called join queries."
        "\n\nfirst item\n\nsecond item"
    )


def test_clean_rst_strips_markup_and_literal_blocks() -> None:
    text = dc.clean_rst(RST)
    assert text == (
        "Classes\n\nClasses bundle data. See abs and the tutorial,\n"
        "or len and Python.  For example:\n\n   Notes are prose and stay.\n\nThe end."
    )


def test_clean_pod_keeps_headings_and_paragraphs() -> None:
    text = dc.clean_pod(POD)
    assert text == (
        "NAME\n\nperlfoo - a foo manual\n\nUsage\n\n"
        "Call $a < $b or bar, see the docs and <tag>.\n\nan item"
    )


def test_clean_text_drops_info_index_entries() -> None:
    text = "Prose here.\n\n\n\n* temporary files:   Semantics.   (line  585)\n* VCS:  Change Logs.\n        (line 3283)\nMore."
    assert dc.clean_text(text) == "Prose here.\n\nMore."


def test_chunk_cuts_long_documents_at_paragraphs() -> None:
    paras = [f"paragraph {i} " + "x" * 90 for i in range(30)]
    text = "\n\n".join(paras)
    parts = dc.chunk(text, size=1000)
    assert "\n\n".join(parts) == text
    assert len(parts) == 3 and all(len(p) >= 1000 for p in parts[:-1])
    assert dc.chunk("short", size=1000) == ["short"]


def test_filter_drops_short_non_english_and_duplicate_documents() -> None:
    long_en = "English prose. " * 40
    docs = [
        ("p/a", long_en),
        ("p/tiny", "too short"),
        ("p/zh", "中文文档" * 200),
        ("p/copy", long_en),
        ("p/b", long_en + "more"),
    ]
    seen: set[bytes] = set()
    assert [s for s, _ in dc.keep_new_prose(docs, seen)] == ["p/a", "p/b"]
    # a later package repeating a document already kept loses it
    assert dc.keep_new_prose([("q/a", long_en)], seen) == []


def test_budget_keeps_small_packages_whole_and_stops_at_the_cap() -> None:
    caps = dc.package_caps({"big": 1000, "mid": 500, "small": 100}, 900)
    assert caps == {"small": 100, "big": 400, "mid": 400}
    docs = [(f"p/{i:02d}", "x" * 100) for i in range(10)]
    chosen = dc.select(docs, 350)
    assert len(chosen) == 3
    assert chosen == sorted(chosen)  # file order, whatever the sampling order
    assert dc.select(docs, 10_000) == docs


def test_writer_is_deterministic_and_readable_by_the_files_source(tmp_path: Path) -> None:
    records = [{"text": "caf\u00e9 prose", "source": "pkg/a"}, {"text": "two", "source": "pkg/b"}]
    path = tmp_path / "a" / "out.jsonl.gz"
    first = dc.write_jsonl_gz(records, path)
    second = dc.write_jsonl_gz(records, tmp_path / "b" / "other.jsonl.gz")
    assert first == second
    # the gzip header holds neither a file name (flags byte 3) nor a time (bytes 4-7)
    assert path.read_bytes()[3:8] == bytes(5)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert [json.loads(line) for line in lines] == records
    assert list(iter_file_documents([path], "text", None)) == ["caf\u00e9 prose", "two"]


def test_license_from_dep5_or_by_hand(tmp_path: Path) -> None:
    doc = tmp_path / "usr/share/doc/pkg"
    doc.mkdir(parents=True)
    pkg = dc.Package("pkg", (), "text", license="public-domain")
    assert dc.package_license(pkg, tmp_path) == "public-domain"
    (doc / "copyright").write_text(
        "Format: x\n\nFiles: *\nCopyright: 2020 A\n 2021 B\nLicense: GPL-2+\n\n"
        "Files: other\nLicense: MIT\n"
    )
    assert dc.package_license(pkg, tmp_path) == "GPL-2+"


def test_apt_failure_is_one_line_naming_package_and_fix(tmp_path: Path) -> None:
    with pytest.raises(DataPrepError, match=r"apt-get download nopkg failed .*apt-get update"):
        dc.download("nopkg", tmp_path, apt="false")
    with pytest.raises(DataPrepError, match=r"nopkg: /nonexistent/apt-get not found"):
        dc.download("nopkg", tmp_path, apt="/nonexistent/apt-get")
    (tmp_path / "nopkg_1.0_all.deb").write_bytes(b"")  # a .deb already there is reused
    assert dc.download("nopkg", tmp_path, apt="false") == tmp_path / "nopkg_1.0_all.deb"


def test_main_reports_error_and_exits_nonzero(tmp_path: Path, capsys) -> None:
    out = tmp_path / "c.jsonl.gz"
    argv = ["--out", str(out), "--work-dir", str(tmp_path), "--apt-get", "/nonexistent/apt"]
    assert dc.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: apt-get download {dc.PACKAGES[0].name}") and "\n" not in err
    assert not out.exists()


def test_the_large_set_keeps_the_base_and_adds_packages_each_once(monkeypatch, tmp_path) -> None:
    base, large = dc.SETS["base"], dc.SETS["large"]
    assert large[: len(base)] == base and len(large) > len(base)
    names = [p.name for p in large]
    assert len(names) == len(set(names))  # no package fetched (and deduplicated) twice
    seen = {}
    monkeypatch.setattr(dc, "build", lambda out, work, max_mb, apt, packages: seen.update(
        max_mb=max_mb, packages=packages))  # fmt: skip
    argv = ["--out", str(tmp_path / "c.jsonl.gz"), "--work-dir", str(tmp_path)]
    assert dc.main([*argv, "--set", "large"]) == 0
    assert seen["packages"] == large and seen["max_mb"] >= 1e6  # every document kept
    assert dc.main(argv) == 0
    assert seen["packages"] == base and seen["max_mb"] == dc.DEFAULT_MAX_MB


def test_a_data_config_with_build_writes_its_missing_file_once(monkeypatch, tmp_path) -> None:
    from data_prep.config import DataConfig, SourceKind
    from data_prep.prepare import build_missing

    out = tmp_path / "raw" / "c.jsonl.gz"
    calls = []
    monkeypatch.setattr(dc, "build", lambda o, work, max_mb, apt, packages: calls.append(
        (o, packages)) or o.parent.mkdir(parents=True) or o.write_bytes(b"x"))  # fmt: skip
    cfg = DataConfig(name="d", kind=SourceKind.files, paths=[str(out)], build="large")
    assert build_missing(cfg) is True and calls == [(out, dc.SETS["large"])]
    assert build_missing(cfg) is False and len(calls) == 1  # there now: not built again
    cfg.build = None
    out.unlink()
    assert build_missing(cfg) is False and not calls[1:]  # no build named: the files must exist


@pytest.mark.parametrize(
    ("build", "paths", "needle"),
    [
        (
            "huge",
            ["a.jsonl.gz"],
            r"data.build='huge' is not a docs_corpus set; use one of base, large",
        ),
        ("large", ["a.jsonl.gz", "b.jsonl.gz"], r"data.build='large' needs kind=files and one"),
    ],
)
def test_a_bad_build_is_named_with_the_fix(build, paths, needle) -> None:
    from data_prep.config import (
        DataConfig,
        PrepareConfig,
        SourceKind,
        TokenizerConfig,
        TokenizerKind,
        validate,
    )

    data = DataConfig(name="d", kind=SourceKind.files, paths=paths, build=build)
    tok = TokenizerConfig(name="t", kind=TokenizerKind.bytebpe, vocab_size=512)
    with pytest.raises(DataPrepError, match=needle):
        validate(PrepareConfig(data=data, tokenizer=tok))

"""The offline default corpus: a sample of English Wikipedia shipped inside gensim.

Where it comes from: the PyPI package `gensim` (pinned, gensim==4.4.0, LGPL-2.1) ships
test data including `gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`,
a shortened English Wikipedia XML dump (1.7 MB bz2, 206 pages: 106 articles and 100
redirects; about 3.1 MB of plain text after markup removal). The article text is
Wikipedia's, licensed CC BY-SA (https://en.wikipedia.org/wiki/Wikipedia:Copyrights);
anything derived from it (including the prepared token files) inherits CC BY-SA and needs
attribution to the Wikipedia contributors. Because it arrives with an ordinary `pip
install`, it is there on a fresh clone with no network beyond the package registry.

We locate it through the installed package (never a hard-coded venv path), drop
redirects, strip wiki markup with gensim's own `filter_wiki`, and tidy what that leaves.
"""

from __future__ import annotations

import bz2
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from data_prep.errors import DataPrepError


@dataclass(frozen=True)
class EmbeddedCorpus:
    package: str
    resource: str  # path inside the installed package
    description: str
    license: str


EMBEDDED_CORPORA = {
    "enwiki_sample": EmbeddedCorpus(
        package="gensim",
        resource="test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
        description="English Wikipedia sample (106 articles) from gensim's test data",
        license="text: CC BY-SA (Wikipedia contributors); carrier package gensim: LGPL-2.1",
    ),
}

# Bump when the cleaning below changes, so old prepared data is not mistaken for new.
CLEANING_VERSION = 1


def corpus_info(name: str) -> EmbeddedCorpus:
    if name not in EMBEDDED_CORPORA:
        known = ", ".join(sorted(EMBEDDED_CORPORA))
        raise DataPrepError(f"unknown embedded corpus {name!r}; use one of: {known}")
    return EMBEDDED_CORPORA[name]


def corpus_path(name: str) -> Path:
    """The corpus file inside its installed package, found without importing the package."""
    info = corpus_info(name)
    spec = importlib.util.find_spec(info.package)
    if spec is None or not spec.submodule_search_locations:
        raise DataPrepError(
            f"package {info.package!r} (carrier of corpus {name!r}) is not installed; run `make setup`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / info.resource
    if not path.is_file():
        raise DataPrepError(
            f"corpus file missing from the {info.package} install: {path}; reinstall with `make setup`"
        )
    return path


def iter_documents(name: str) -> Iterator[str]:
    """Cleaned, non-empty articles in dump order.

    Parsing and cleaning cost ~2.5 s for the whole dump, and a run reads the corpus up to
    three times (empty check, tokenizer training, writing), often only a prefix of it: so
    pages are parsed lazily, once per process, and every later pass replays what is parsed.
    """
    parsed, pending = _parsed(name)
    position = 0
    while True:
        if position < len(parsed):
            yield parsed[position]
            position += 1
            continue
        document = next(pending, None)
        if document is None:
            return
        parsed.append(document)


@lru_cache(maxsize=2)
def _parsed(name: str) -> tuple[list[str], Iterator[str]]:
    return [], _parse(corpus_path(name))


def _parse(path: Path) -> Iterator[str]:
    # gensim's import costs ~2 s, so only pay it when the text is really needed.
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    with bz2.open(path) as stream:
        for title, wikitext, _page_id in extract_pages(stream):
            if wikitext.lstrip().lower().startswith("#redirect"):
                continue
            text = tidy_wiki_text(filter_wiki(wikitext))
            if text:
                yield f"{title}\n\n{text}"


_EMPHASIS = re.compile(r"'{2,}")  # ''italic'' and '''bold''' quote runs
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$", re.MULTILINE)  # == Heading ==
_EMPTY_BULLET = re.compile(r"^[*#:;]+\s*$", re.MULTILINE)  # list items left empty
_BLANK_RUN = re.compile(r"\n{3,}")


def tidy_wiki_text(text: str) -> str:
    """Remove what filter_wiki leaves: emphasis quotes, heading markers, empty bullets."""
    text = _EMPHASIS.sub("", text)
    text = _HEADING.sub(r"\2", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = _EMPTY_BULLET.sub("", text)
    return _BLANK_RUN.sub("\n\n", text).strip()

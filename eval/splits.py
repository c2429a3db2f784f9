"""Read a prepared split back: its token stream and its documents.

The prepared data keeps no raw text, only Megatron indexed datasets (`<split>.bin` with
the token ids, `<split>.idx` with per-document lengths and byte offsets; each document ends
with the EOD id, see data_prep.writer). Reading them needs only numpy: importing
megatron-core for its `IndexedDataset` would cost seconds and gain nothing here.
Documents are decoded with the exact tokenizer of the data, which for the byte-level and
GPT-2 BPEs gives back the original text.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_prep.dataset import PreparedData

__all__ = ["SplitReader"]

# Megatron-Core's .idx header (indexed_dataset._IndexWriter): magic, version, dtype code,
# sequence count, document count; then int32 lengths[n], int64 byte offsets[n], ...
_IDX_HEADER = struct.Struct("<9sQBQQ")


@dataclass
class SplitReader:
    """The documents of one split; `load_prepared` has already checked the files' sizes."""

    tokens: np.ndarray  # the whole split as one memory-mapped stream, EODs included
    lengths: np.ndarray  # tokens per document, its EOD included
    starts: np.ndarray  # index of each document's first token in `tokens`
    eod: int

    @classmethod
    def open(cls, prepared: PreparedData, split: str) -> SplitReader:
        dtype = np.dtype(prepared.metadata["dtype"])
        idx = Path(prepared.prefix(split) + ".idx")
        with open(idx, "rb") as stream:
            _, _, _, count, _ = _IDX_HEADER.unpack(stream.read(_IDX_HEADER.size))
        lengths = np.fromfile(idx, dtype=np.int32, count=count, offset=_IDX_HEADER.size)
        offsets = np.fromfile(idx, dtype=np.int64, count=count, offset=_IDX_HEADER.size + 4 * count)
        tokens = np.memmap(prepared.prefix(split) + ".bin", dtype=dtype, mode="r")
        eod = int(prepared.metadata["tokenizer"]["eod"])
        return cls(tokens, lengths.astype(np.int64), offsets // dtype.itemsize, eod)

    def __len__(self) -> int:
        return len(self.lengths)

    def document(self, i: int) -> list[int]:
        """Token ids of document `i` without its closing EOD."""
        ids = self.tokens[self.starts[i] : self.starts[i] + self.lengths[i]].tolist()
        return ids[:-1] if ids and ids[-1] == self.eod else ids

"""Offline tokenizer assets: where they live, their pinned hashes, and how setup fetches them.

GPT-2 BPE: the `openai-whisper` sdist on PyPI (MIT licence) carries
`whisper/assets/gpt2.tiktoken`, byte-identical to OpenAI's r50k_base.tiktoken (the exact
GPT-2 merges; tiktoken pins the same sha256 for r50k_base). `make setup` runs
`python -m data_prep.assets`, which downloads that sdist with pip (the package registry is
the only network it needs), extracts the one file, checks the hash and installs it under
the venv; after that everything is offline.

Llama-style 32k SentencePiece: `mistral_common` (Apache-2.0, a pinned dependency) ships
`data/tokenizer.model.v1`, the Mistral-7B v0.1 tokenizer: a 32,000-entry SentencePiece BPE
with byte fallback, <unk>=0, <s>=1, </s>=2, the same design and size as Llama-2's (the
merges differ from Meta's; no Llama-2 model file is redistributable on PyPI).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from data_prep.errors import DataPrepError

GPT2_FILE = "gpt2.tiktoken"
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_CARRIER = "openai-whisper==20250625"
GPT2_MEMBER = "whisper/assets/gpt2.tiktoken"

LLAMA_SP_PACKAGE = "mistral_common"
LLAMA_SP_RESOURCE = "data/tokenizer.model.v1"
LLAMA_SP_SHA256 = "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"


def assets_dir() -> Path:
    """Inside the venv, so `make clean-venv` + `make setup` rebuild it with everything else."""
    return Path(os.environ.get("SCAPE_ASSETS_DIR", Path(sys.prefix) / "share" / "scape-assets"))


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gpt2_asset(path: str | None = None) -> Path:
    """The verified GPT-2 .tiktoken file (default location unless `path` is given)."""
    asset = Path(path) if path else assets_dir() / GPT2_FILE
    if not asset.is_file():
        raise DataPrepError(
            f"GPT-2 BPE asset not found at {asset}; run `make setup` "
            "(or `.venv/bin/python -m data_prep.assets` on an existing venv)"
        )
    digest = sha256_of(asset)
    if digest != GPT2_SHA256:
        raise DataPrepError(
            f"GPT-2 BPE asset {asset} has sha256 {digest[:12]}..., expected {GPT2_SHA256[:12]}...; "
            "delete it and run `.venv/bin/python -m data_prep.assets`"
        )
    return asset


def llama_sp_asset() -> Path:
    spec = importlib.util.find_spec(LLAMA_SP_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataPrepError(f"package {LLAMA_SP_PACKAGE} is not installed; run `make setup`")
    path = Path(next(iter(spec.submodule_search_locations))) / LLAMA_SP_RESOURCE
    if not path.is_file():
        raise DataPrepError(
            f"{path} is missing from the {LLAMA_SP_PACKAGE} install; run `make setup`"
        )
    return path


def fetch_gpt2_asset(dest_dir: Path | None = None) -> Path:
    """Download the carrier sdist with pip, extract the asset, verify it, install atomically."""
    dest = (dest_dir or assets_dir()) / GPT2_FILE
    if dest.is_file() and sha256_of(dest) == GPT2_SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--no-binary", ":all:", GPT2_CARRIER, "-d", tmp],
            check=True,
        )
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("/" + GPT2_MEMBER))
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_SHA256:
        raise DataPrepError(
            f"{GPT2_CARRIER} gave a gpt2.tiktoken with sha256 {digest}; not installing it"
        )
    partial = dest.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(dest)
    return dest


if __name__ == "__main__":
    print(f"GPT-2 BPE asset: {fetch_gpt2_asset()}")

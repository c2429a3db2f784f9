"""Data preparation: text corpora -> tokenizer -> Megatron-Core indexed datasets.

No Hydra here (`pipelines.prepare` is the Hydra stage); the API later stages use:
- `data_prep.prepare.prepare(cfg)`: run the stage (idempotent, atomic);
- `data_prep.dataset.load_prepared(path)` / `check_prepared(path, tokenizer)`: open and
  verify prepared data; `prepared_dir(root, data, tokenizer)`: where it lives;
- `data_prep.tokenizers.build_tokenizer(cfg)`, `padded_vocab_size(...)`,
  `check_model_vocab(...)`: Megatron-compatible tokenizers and the vocabulary rules.
See data_prep/README.md for the corpora, tokenizers, their origins and licences.
May import ``scape``; never ``eval``, ``pipelines`` or ``benchmarks``.
"""

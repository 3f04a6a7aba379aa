"""A model's tokenizer files, made here: a small byte-level BPE and a ChatML chat template.

Tests and benchmarks cannot download a real model's tokenizer, and need none: any
``tokenizer.json`` the ``tokenizers`` library reads exercises the same code. Training on a fixed
corpus is deterministic, so every process that loads the files gets the same ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS = "<s>", "</s>"
# ChatML, as many instruction-tuned models write it, with a BOS first and an answer prompt.
CHATML = (
    "{{ bos_token }}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = tuple(
    f"rule {i} keep answers short and exact; the user asked about item {i * 7 % 101}."
    for i in range(400)
)


def write_tokenizer(
    folder: Path,
    template: str | None = CHATML,
    corpus: Iterable[str] = CORPUS,
    vocab_size: int = 600,
) -> Path:
    """A model folder with ``tokenizer.json`` and ``tokenizer_config.json``; returns it.

    A plain prompt encodes with a BOS in front (the post-processor), as a completion's does.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": BOS, "eos_token": {"content": EOS}}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder

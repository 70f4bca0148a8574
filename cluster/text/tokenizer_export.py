"""Write a checkpoint's tokenizer as transformers builds it, for the router to read without transformers.

Run as a child process (`python -m cluster.text.tokenizer_export MODEL_DIR OUT_DIR [MODEL_DIR OUT_DIR
...]`, each pair in turn): transformers imports torch, and the router must not. transformers adjusts
a checkpoint's `tokenizer.json` as it loads it (class-specific pre-tokenizers, a post-processor
rebuilt from `add_bos_token`), so the router reads the pipeline transformers ended with, not the
file it started from: the ids match the replica's by construction.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

META_FILE = "router_tokenizer.json"


def export(model_dir: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tok, "is_fast", False):
        raise SystemExit(f"{model_dir}: the tokenizer has no fast (tokenizer.json) form")
    out.mkdir(parents=True, exist_ok=True)
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    specials = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
    meta = {
        "chat_template": tok.chat_template if isinstance(tok.chat_template, str) else None,
        "special_tokens": specials,
        "clean_up_spaces": bool(getattr(tok, "clean_up_tokenization_spaces", False)),
        "vocab_size": len(tok),
    }
    (out / META_FILE).write_text(json.dumps(meta), encoding="utf-8")


def main(args: list[str]) -> int:
    """Export each (MODEL_DIR, OUT_DIR) pair; one pair's error ends the process as it was raised,
    and with several each failed pair is reported and skipped (its OUT_DIR stays without the meta
    file) and the exit status is 1."""
    pairs = list(zip(args[::2], args[1::2], strict=True))
    if len(pairs) == 1:
        export(Path(pairs[0][0]), Path(pairs[0][1]))
        return 0
    failed = 0
    for model_dir, out in pairs:
        try:
            export(Path(model_dir), Path(out))
        except (Exception, SystemExit) as exc:
            failed += 1
            print(f"{model_dir}: {exc}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

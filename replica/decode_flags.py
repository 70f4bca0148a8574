"""The engine's decode-kernel knobs as command-line flags, for the tools that A/B them on the GPU.

`bench.engine_lockstep` and `bench.kernel_profile` take the same flags; their defaults are
EngineConfig's, so a run without flags measures the engine as it ships.
"""

from __future__ import annotations

import argparse

from replica.config import EngineConfig

_DEFAULTS = EngineConfig()


def add_decode_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--split-prompts", action="store_true", help="fill each step's budget (keep_prompts_whole off)"
    )
    p.add_argument("--decode-splits", type=int, default=None, help="decode attention splits (default: auto)")
    p.add_argument(
        "--decode-tile", type=int, default=_DEFAULTS.decode_attention_tile, help="decode attention tile"
    )
    p.add_argument(
        "--separate-rope", action="store_true", help="decode: rotary + cache write in their own kernel"
    )
    p.add_argument(
        "--k-slices", type=int, default=_DEFAULTS.decode_k_slices, help="o/down as K-slice partials"
    )
    p.add_argument(
        "--triton-gemms", default=",".join(_DEFAULTS.decode_triton_gemms), help="o,down: Triton partials"
    )


def decode_config(args: argparse.Namespace) -> dict:
    """EngineConfig keyword arguments from the flags of `add_decode_flags`."""
    return {
        "keep_prompts_whole": not args.split_prompts,
        "decode_attention_splits": args.decode_splits,
        "decode_attention_tile": args.decode_tile,
        "decode_attention_rope": not args.separate_rope,
        "decode_k_slices": args.k_slices,
        "decode_triton_gemms": tuple(g for g in args.triton_gemms.split(",") if g),
    }

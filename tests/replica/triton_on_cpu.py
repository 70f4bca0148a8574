"""Triton's interpreter on the CPU, for tests of kernel logic without a GPU.

Import this module first in a process started with TRITON_INTERPRET=1 (Triton decides at import and
decoration time, so tests run it in a child process). Triton 3.6's interpreter turns a scalar
into an index with int() on a one-element array, which NumPy 2.4 refuses; the patch reads the
element instead.
"""

from __future__ import annotations

import os

import triton.runtime.interpreter as interpreter

assert os.environ.get("TRITON_INTERPRET") == "1", "start the process with TRITON_INTERPRET=1"
_original_patch = interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope) -> None:
    _original_patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


interpreter._patch_lang_tensor = _patch_lang_tensor

"""Workaround for Triton 3.6's interpreter under numpy >= 2.4 (triton-lang/triton#9171).

The interpreter turns a scalar tensor into a Python int with ``int(array)``, but scalars it
loads are 1-element arrays, which numpy 2.4 no longer converts: a ``range`` bounded by a loaded
value (every attention kernel's loop) then fails. Squeeze before converting.
"""

from __future__ import annotations

from typing import Any


def patch_interpreter_index() -> None:
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_squeezes_index", False):
        return

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._squeezes_index = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched

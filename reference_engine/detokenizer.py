"""Incremental detokenization: text grows token by token, never ends in a broken UTF-8
character, and its concatenation equals the full decode. Stop strings end the text as vLLM does.

Each step decodes only a short window: the tokens since ``prefix_offset`` (the start of the text
already emitted before the last emission). Byte-level BPE can split a character over several
tokens; while the window's text ends in U+FFFD the new bytes are held back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase


@dataclass
class IncrementalDetokenizer:
    tokenizer: PreTrainedTokenizerBase | None
    skip_special_tokens: bool = True
    stop_strings: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0
    # The text of single tokens, by id: most steps' prefix is the one token emitted last, and
    # the engine shares one cache among its requests (one per ``skip_special_tokens``).
    token_texts: dict[int, str] = field(default_factory=dict)

    def add_tokens(
        self, new_token_ids: list[int], check_stop_from: int = 0
    ) -> tuple[str | None, int]:
        """Appends tokens and their text; returns the stop string that matched (if any) and the
        number of tokens taken, the last being the one that completed the stop string.

        Stop strings are looked for only in text produced by tokens at index ``check_stop_from``
        or later (tokens before ``min_tokens`` cannot stop the request)."""
        if self.tokenizer is None:
            self.token_ids.extend(new_token_ids)
            return None, len(new_token_ids)
        if not self.stop_strings:
            for token_id in new_token_ids:
                self.token_ids.append(token_id)
                self._decode_next()
            return None, len(new_token_ids)
        for i, token_id in enumerate(new_token_ids):
            self.token_ids.append(token_id)
            before = len(self.text)
            self._decode_next()
            if len(self.token_ids) > check_stop_from:
                stop = self._find_stop(before)
                if stop is not None:
                    return stop, i + 1
        return None, len(new_token_ids)

    def __post_init__(self) -> None:
        # The Rust tokenizer's own decode skips transformers' per-call overhead; it gives the same
        # text unless the tokenizer cleans up spaces afterwards.
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if self.tokenizer is None:  # skip_tokenizer_init: token ids only, no text
            self._decode = lambda ids: ""
        elif backend is None or getattr(self.tokenizer, "clean_up_tokenization_spaces", False):
            self._decode = lambda ids: self.tokenizer.decode(
                ids, skip_special_tokens=self.skip_special_tokens
            )
        else:
            # The flag goes by position: by keyword (as a functools.partial passes it) each call
            # took a third longer.
            decode, skip_special_tokens = backend.decode, self.skip_special_tokens
            self._decode = lambda ids: decode(ids, skip_special_tokens)

    def _decode_next(self) -> None:
        ids, start, read = self.token_ids, self.prefix_offset, self.read_offset
        if read - start == 1:
            prefix = self.token_texts.get(ids[start])
            if prefix is None:
                prefix = self.token_texts[ids[start]] = self._decode(ids[start:read])
        else:
            prefix = self._decode(ids[start:read])
        window = self._decode(ids[start:])
        if len(window) > len(prefix) and not window.endswith("\ufffd"):
            self.text += window[len(prefix) :]
            self.prefix_offset, self.read_offset = read, len(ids)

    def _find_stop(self, new_text_start: int) -> str | None:
        for stop in self.stop_strings:
            # A match may begin before the new text, as long as it ends inside it.
            i = self.text.find(stop, max(new_text_start - len(stop) + 1, 0))
            if i != -1:
                self.text = self.text[: i + len(stop) if self.include_stop_str_in_output else i]
                return stop
        return None

    def visible_text(self, finished: bool) -> str:
        """The text safe to show: while running, a tail that could still grow into a stop string
        is withheld, so streamed text never shows what a stop will later cut."""
        if finished or not self.stop_strings or self.include_stop_str_in_output:
            return self.text
        hold = max(len(s) for s in self.stop_strings) - 1
        return self.text[: max(len(self.text) - hold, 0)]

    def flush(self) -> None:
        """At the end: emits the bytes still held back, less an incomplete trailing character
        (dropped, as vLLM does, rather than shown as U+FFFD)."""
        if self.tokenizer is None or self.read_offset >= len(self.token_ids):
            return
        ids = self.token_ids
        prefix = self._decode(ids[self.prefix_offset : self.read_offset])
        window = self._decode(ids[self.prefix_offset :])
        self.text += window[len(prefix) :].rstrip("\ufffd")
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)

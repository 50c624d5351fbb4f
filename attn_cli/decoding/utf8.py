"""Outputs that are always valid UTF-8, with a tokenizer that falls back to bytes.

SentencePiece's byte fallback writes a character it has no piece for as byte pieces <0xNN>. A search
free to pick any piece can emit a lead byte without its continuation bytes, or a stray continuation
byte, which decodes to U+FFFD. `Utf8Constraint` rules out, at each step, every byte piece that
cannot continue a well-formed UTF-8 sequence (Unicode's table 3-7) and, while a sequence is open,
every other piece and EOS; a lead byte is allowed only when its sequence can end before the row's
length limit. The search stays exact over the valid outputs: it only removes the invalid ones.

The state of a row is read from its last tokens, so it follows beams however they are reordered.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

from attn_cli.data.tokenizer import Tokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")
_LONGEST_SEQUENCE = 4


def _byte_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per byte value: how many continuation bytes it needs as a lead (-1: not a lead: ASCII takes
    0), and the range the byte after it must fall in (from table 3-7: E0, ED, F0 and F4 narrow it)."""
    needs = torch.full((256,), -1, dtype=torch.long)
    needs[:0x80] = 0
    needs[0xC2:0xE0] = 1
    needs[0xE0:0xF0] = 2
    needs[0xF0:0xF5] = 3
    low = torch.full((256,), 0x80, dtype=torch.long)
    high = torch.full((256,), 0xBF, dtype=torch.long)
    low[0xE0], high[0xED], low[0xF0], high[0xF4] = 0xA0, 0x9F, 0x90, 0x8F
    return needs, low, high


class Utf8Constraint:
    """The byte pieces of one target vocabulary, and which of them may come next in each row."""

    rule = "the valid-UTF-8 rule"  # how a message names it

    def __init__(self, byte_of_piece: torch.Tensor):
        self.byte_of_piece = byte_of_piece  # (V,) the byte value of each byte piece, -1 for the others
        self.needs, self.low, self.high = _byte_tables()
        piece_needs = torch.where(byte_of_piece >= 0, self.needs[byte_of_piece.clamp(min=0)], -2)
        # Byte pieces that can never start a character: continuation bytes and bytes UTF-8 never uses.
        self.never_first = (piece_needs == -1).nonzero().squeeze(1)
        # The lead pieces of 2-, 3- and 4-byte characters.
        self.leads_needing = {n: (piece_needs == n).nonzero().squeeze(1) for n in (1, 2, 3)}

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> Optional["Utf8Constraint"]:
        """The constraint of `tokenizer`'s byte pieces; None when it has none (every output is text)."""
        pieces = tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))
        values = [int(match.group(1), 16) if (match := _BYTE_PIECE.fullmatch(piece)) else -1 for piece in pieces]
        if max(values) < 0:
            return None
        return cls(torch.tensor(values, dtype=torch.long))

    def restrict(self, log_probs: torch.Tensor, history: torch.Tensor, steps_left: torch.Tensor) -> torch.Tensor:
        """Rule out, in place, what would make a row's output invalid UTF-8. `history` (rows, L) is
        each row's BOS, prefix and searched tokens; `steps_left` (rows,) how many tokens each row may
        still add before its EOS, this one included.

        Rows with no character open (nearly all) lose a fixed set of columns, and near their limit
        the leads of characters that could not end in time; a row inside a character keeps only the
        bytes that may come next in it."""
        device = log_probs.device
        open_for, next_low, next_high = self._open_sequences(history.to(device))
        inside = (open_for > 0).nonzero().squeeze(1)
        kept = log_probs[inside]  # before the columns below are ruled out for every row
        log_probs[:, self.never_first.to(device)] = float("-inf")
        for need, leads in self.leads_needing.items():  # n continuation bytes need n + 1 tokens
            late = ((open_for == 0) & (steps_left <= need)).nonzero().squeeze(1)
            if late.numel() and leads.numel():
                log_probs[late[:, None], leads.to(device)[None, :]] = float("-inf")
        if inside.numel():
            piece_bytes = self.byte_of_piece.to(device)[None, :]  # (1, V)
            allowed = (piece_bytes >= next_low[inside, None]) & (piece_bytes <= next_high[inside, None])
            log_probs[inside] = kept.masked_fill(~allowed, float("-inf"))  # EOS and text pieces too
        return log_probs

    def _open_sequences(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows,) how many continuation bytes each row's output still needs, and the range of the next."""
        device = history.device
        needs, low, high = self.needs.to(device), self.low.to(device), self.high.to(device)
        rows = history.shape[0]
        # The last 4 tokens (a character is at most 4 bytes) as byte values; -1 for other pieces and before the start.
        tail = torch.full((rows, _LONGEST_SEQUENCE), -1, dtype=torch.long, device=device)
        width = min(_LONGEST_SEQUENCE, history.shape[1] - 1)  # BOS is no byte
        if width > 0:
            tail[:, -width:] = self.byte_of_piece.to(device)[history[:, -width:]]
        is_continuation = (tail >= 0x80) & (tail <= 0xBF)
        # The run of continuation bytes that ends the output (0 to 3 in valid text), and the byte before it.
        trailing = is_continuation.flip(1).long().cumprod(dim=1).sum(dim=1)
        lead = tail.gather(1, (_LONGEST_SEQUENCE - 1 - trailing).clamp(min=0)[:, None]).squeeze(1)
        lead_needs = torch.where((lead >= 0) & (trailing < _LONGEST_SEQUENCE), needs[lead.clamp(min=0)], -1)
        open_for = (lead_needs - trailing).clamp(min=0)
        right_after_lead = trailing == 0
        next_low = torch.where(right_after_lead, low[lead.clamp(min=0)], 0x80)
        next_high = torch.where(right_after_lead, high[lead.clamp(min=0)], 0xBF)
        return open_for, next_low, next_high

"""Decoding: sources in, translations out.

The records (`records`: a `Source` per input sentence, a `Translation` per output), the pipeline
that turns one into the other in stages (`pipeline`: `parts` splits and encodes, `batches` decodes
in token-budget batches, `terms_pass` places a glossary's terms, then assembly), and the `engine`
protocol it decodes with (the engines themselves are attn_cli/engines/). Below them, attn's own
searches over the KV cache, each able to start from a forced prefix: greedy decoding and sampling
(`greedy`), batched beam search (`beam`), lexically constrained beam search (`constrained`), what
they share (`search`: settings, length limits, the next-token distribution and the rules on it;
`hypothesis`), and several models searched as one (`ensemble`). Around them: the decoding options
as flags and fields (`options`), glossaries (`glossary`), input lines and output formats (`io`),
attention inspection (`attention_view`) and sacreBLEU scoring (`scoring`, `by_length`).

May import `attn_cli.model` and `attn_cli.data`; nothing of training, the engines or the command
line. The records, the pipeline and the modules it imports import no torch, so that an engine
without torch (CTranslate2) starts fast."""

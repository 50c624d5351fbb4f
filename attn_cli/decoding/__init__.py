"""Decoding: greedy decoding and sampling (`greedy`), batched beam search (`beam`), several models
searched as one (`ensemble`), sentences in and translations out (`translate`), input lines and
stdin in and text or JSONL out (`io`), attention inspection (`attention_view`) and sacreBLEU
scoring (`scoring`). Every search runs over the model's KV cache, and may start from a forced
prefix. May import `attn_cli.model` and `attn_cli.data`; nothing of training or the command line."""

"""A reference greedy decode for tests: plain onnxruntime over a decoder in the Optimum convention
(`past_key_values.N.key|value` in, `present.N.key|value` out), written without the agent's code, so a
test can hold what the agent decoded on a device against what the host decodes from the same prompt."""

from __future__ import annotations

from pathlib import Path


def greedy_tokens(path: Path, prompt: list[int], steps: int) -> list[int]:
    """The first greedy token after the prompt, then `steps` more, each step feeding the cache back."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    caches = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in caches}
    presents = [n.replace("past_key_values.", "present.") for n in past]
    ids, start, tokens = prompt, 0, []
    for _ in range(steps + 1):
        feeds = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, start + len(ids)), np.int64),
            "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None],
            **past,
        }
        logits, *kv = sess.run(["logits", *presents], feeds)
        past = dict(zip(past, kv, strict=True))
        start += len(ids)
        ids = [int(logits[0, -1].argmax())]
        tokens.append(ids[0])
    return tokens

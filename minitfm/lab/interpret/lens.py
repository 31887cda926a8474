"""The logit lens of the decoder: what each layer would write if it were the last.

At every decoding step, the output of each decoder layer goes through what the model applies
after its last layer and before the output projection (`decoder_norm`: the final layer norm of a
pre-LN model, nothing for post-LN), then through the projection itself (nostalgebraist 2020).
The last layer's reading is the model's own output; earlier layers show when the answer forms.
The decoder reads BOS + the model's greedy answer, so each step sees what decoding saw.

Shapes: T decoder len, D d_model, V vocab size.
"""

from __future__ import annotations

import torch

from minitfm.book.metrics import predict
from minitfm.book.model import eval_mode
from minitfm.lab.interpret.ablate import this_threads
from minitfm.tasks.base import Task


@torch.no_grad()
def logit_lens(model, task: Task, src: list[int]) -> dict:
    """For `src`: the answer, and per decoder layer and step the token it would write, its
    probability and the probability of the token the model did write (EOS included)."""
    vocab, device = task.vocab, next(model.parameters()).device
    answer = predict(model, task, [src], device)[0]
    written = [*answer, vocab.eos_id]
    outputs = []  # this thread's passes only: a `Run` may be shared by threads
    keep = this_threads(lambda _m, _i, out: outputs.append(out[0]))
    hooks = [layer.register_forward_hook(keep) for layer in model.decoder_layers]
    try:
        with eval_mode(model):
            model(torch.tensor([src], device=device),
                  torch.tensor([[vocab.bos_id, *answer]], device=device))
    finally:
        for hook in hooks:
            hook.remove()
    layers = []
    for x in outputs:  # (1, T, D) each
        probs = model.generator(model.decoder_norm(x))[0].float().softmax(-1)  # (T, V)
        top = probs.argmax(-1)  # (T,)
        layers.append([{"token": vocab.token(int(top[t])), "p": float(probs[t, top[t]]),
                        "p_written": float(probs[t, token])}
                       for t, token in enumerate(written)])
    return {"input": task.format(src), "written": [vocab.token(t) for t in written],
            "layers": layers}

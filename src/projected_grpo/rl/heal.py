"""Retain heal (issue 25, off by default): after GRPO, a few NLL steps on the clean completions of the held-out
extraction pairs, knob off, main δS only — the short repair after deletion that gradient-routing systems run (ERA's
coherence fine-tune, jnward's retain fine-tune, vGROUT's one NLL epoch on the clean side of its pairs;
docs/routing.md §2). It trains the deployed policy on authored clean solutions, never on training rollouts
or labels, so routing's no-cheat invariant holds.
"""

from __future__ import annotations

import torch

from projected_grpo.method.basis import encode
from projected_grpo.method.gate import HeldOutPairs
from projected_grpo.policy.adapter import adapters, knob_disabled
from projected_grpo.policy.logprobs import batch_sequences, completion_logprobs, mean_nll


def heal_batches(n_pairs: int, steps: int, batch: int) -> list[list[int]]:
    """Pair indices of each heal step: the pairs in order, `batch` at a time, wrapping around (deterministic)."""
    return [[(s * batch + i) % n_pairs for i in range(min(batch, n_pairs))] for s in range(steps)]


def retain_heal(model, tok, pairs: HeldOutPairs, steps: int, lr: float, batch: int, temperature: float) -> list[float]:
    """`steps` Adam steps (learning rate `lr`, fresh moments) on δS of every adapter, minimising the mean
    per-completion NLL (at `temperature`, as every log-prob here) of the pairs' clean completions under the knob-off
    policy; δS_h is neither used nor changed. Returns each step's mean NLL before its update."""
    if not pairs.clean:
        raise ValueError("retain heal needs held-out extraction pairs with clean completions")
    deltas = [a.delta for a in adapters(model).values()]
    opt = torch.optim.Adam(deltas, lr=lr)
    prompts, comps = encode(tok, pairs.records, pairs.clean)  # token ids, as the basis stage encodes the pairs
    losses = []
    with knob_disabled(model):
        for idx in heal_batches(len(comps), steps, batch):
            ids, att, cm = batch_sequences([prompts[i] for i in idx], [comps[i] for i in idx], tok.pad_token_id)
            model.zero_grad(set_to_none=True)
            logp, mask = completion_logprobs(model, ids, att, cm, temperature)
            loss = mean_nll(logp, mask).mean()
            loss.backward(inputs=deltas)
            opt.step()
            losses.append(float(loss.detach()))
    model.zero_grad(set_to_none=True)
    return losses
